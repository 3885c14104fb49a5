#!/usr/bin/env python3
"""Server time per task of the Redis queue's three hot scripts (schedule.lua, claim.lua,
finish.lua), alone on a redis-server of its own: N tasks scheduled in batches of B, then claimed
B at a time and acked B at a time, as the queue's own batches do; SLOWLOG (threshold 0) gives
each invocation's execution time, summed per script and divided by N. Medians over ROUNDS.

    python3 durable/benches/scripts/script_cost.py [SCRIPT_DIR] [N] [B] [ROUNDS]

SCRIPT_DIR defaults to durable/src/redis/scripts; `floor/` next to this file holds the least a
script set with the same states could do (no checks, no replies kept, no stats), for
comparison. Needs redis-server on PATH; no Python package beyond the standard library.

With NATIVE=1 it then also measures (NATIVE=only: only that) a schedule's whole server CPU (`INFO cpu`: the script, the
commands it calls, and the event loop's read, parse and write of each invocation) two ways,
the same N tasks in calls of B, one call at a time (redis-server pinned to CPU 0, the client
to CPU 1): `schedule.lua` as the queue sends it, and
the native commands that write the same three entries per task (payload, record, due-set
member) in one MULTI/EXEC with no check and no kept reply: what a schedule of a generated id
would cost the server with no Lua on its path (issue 30 item 1).
"""
import os, socket, statistics, subprocess, sys, tempfile, time

here = os.path.dirname(os.path.abspath(__file__))
sdir = (sys.argv[1] if len(sys.argv) > 1 else '') or os.path.join(here, '..', '..', 'src', 'redis', 'scripts')
N = int(sys.argv[2]) if len(sys.argv) > 2 else 12000
B = int(sys.argv[3]) if len(sys.argv) > 3 else 12
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3


def encode(args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = str(a).encode() if isinstance(a, (int, str)) else a
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


class Redis:
    """The least RESP client that does: one command, one reply."""

    def __init__(self, port):
        self.sock = socket.create_connection(('127.0.0.1', port))
        self.buf = b''

    def _fill(self, n):
        while len(self.buf) < n:
            self.buf += self.sock.recv(1 << 20)

    def _line(self):
        while b'\r\n' not in self.buf:
            self.buf += self.sock.recv(1 << 20)
        line, self.buf = self.buf.split(b'\r\n', 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b'+':
            return rest
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind == b':':
            return int(rest)
        if kind == b'$':
            n = int(rest)
            if n < 0:
                return None
            self._fill(n + 2)
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value
        if kind == b'*':
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError(line)

    def call(self, *args):
        self.sock.sendall(encode(args))
        return self._reply()


port = int(subprocess.check_output([sys.executable, '-c',
    'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])']))


def start_server(*options, pin=()):
    """A redis-server of our own on `port` (no persistence), and a client once it answers."""
    server = subprocess.Popen([*pin, 'redis-server', '--port', str(port), '--bind', '127.0.0.1',
        '--save', '', '--appendonly', 'no', '--dir', tempfile.mkdtemp(), *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            client = Redis(port)
            client.call('PING')
            return server, client
        except OSError:
            time.sleep(0.05)
    raise RuntimeError('redis-server did not answer')


server, r = start_server('--slowlog-log-slower-than', '0', '--slowlog-max-len', '100000')

queue_scripts = os.path.join(here, '..', '..', 'src', 'redis', 'scripts')


def load(name):
    # A script set without a prelude of its own (floor/) uses the queue's.
    prelude_dir = sdir if os.path.exists(os.path.join(sdir, 'prelude.lua')) else queue_scripts
    prelude = open(os.path.join(prelude_dir, 'prelude.lua')).read()
    return r.call('SCRIPT', 'LOAD', prelude + open(os.path.join(sdir, name)).read()).decode()
q = 'tw:{cost}:'
K = {k: q + k for k in ['payload', 'meta', 'due', 'inflight', 'dead', 'seq', 'token', 'idle',
                        'wake', 'stats', 'lateness', 'paused']}
lease, window, attempts = 5000, 5000, 10
per_task = {'tw-schedule': [], 'tw-claim': [], 'tw-finish': []}
try:
    schedule, claim, finish = load('schedule.lua'), load('claim.lua'), load('finish.lua')
    # NATIVE=only: just the comparison below.
    for rnd in range(0 if os.environ.get('NATIVE') == 'only' else ROUNDS):
        r.call('FLUSHALL')
        r.call('SLOWLOG', 'RESET')
        for start in range(0, N, B):
            ids = ['task-%d-%d' % (rnd, i) for i in range(start, min(N, start + B))]
            keys = [K['payload'], K['meta'], K['due'], K['dead'], K['seq'], K['idle'],
                    K['inflight'], q + 'call:s%d-%d' % (rnd, start)]
            args = ['tw-schedule', K['wake'], window, 2**62]
            for i in ids:
                args += [i, b'x' * 64, 'after', 0, 'c' + i]
            r.call('EVALSHA', schedule, len(keys), *keys, *args)
        number = 0
        while True:
            number += 1
            keys = [K['meta'], K['due'], K['inflight'], K['dead'], K['token'], K['payload'],
                    q + 'claim:w1', K['idle'], K['stats'], K['lateness'], K['paused']]
            reply = r.call('EVALSHA', claim, len(keys), *keys, 'tw-claim', lease, B, attempts,
                           K['wake'], 100, 'w1', number)
            tasks = reply[4:]
            if not tasks:
                break
            keys = [K['payload'], K['meta'], K['inflight'], K['due'], K['dead'], K['idle'],
                    K['stats'], q + 'call:f%d-%d' % (rnd, number)]
            args = ['tw-finish', K['wake'], attempts, window]
            for i in range(0, len(tasks), 5):
                args += [tasks[i], tasks[i + 3], 'ack', 0, '']
            assert all(x == b'1' for x in r.call('EVALSHA', finish, len(keys), *keys, *args))
        assert r.call('ZCARD', K['due']) == 0 and r.call('HLEN', K['meta']) == 0, 'tasks left'
        spent = {}
        for entry in r.call('SLOWLOG', 'GET', 100000):
            command = entry[3]
            if command[0] == b'EVALSHA':
                label = command[3 + int(command[2])].decode()
                spent[label] = spent.get(label, 0) + entry[2]
        for label in per_task:
            per_task[label].append(spent.get(label, 0) / N)
finally:
    server.terminate()
    server.wait()


def server_cpu():
    info = r.call('INFO', 'cpu').decode()
    fields = dict(line.split(':', 1) for line in info.split('\r\n') if ':' in line)
    return float(fields['used_cpu_user']) + float(fields['used_cpu_sys'])


def schedule_by_script(rnd):
    for start in range(0, N, B):
        keys = [K['payload'], K['meta'], K['due'], K['dead'], K['seq'], K['idle'],
                K['inflight'], q + 'call:n%d-%d' % (rnd, start)]
        args = ['tw-schedule', K['wake'], window, 2**62]
        for i in range(start, min(N, start + B)):
            args += ['n-%d-%d' % (rnd, i), b'x' * 64, 'at', 1_800_000_000_000 + i, 'c%d' % i]
        r.call('EVALSHA', schedule, len(keys), *keys, *args)


def schedule_native(rnd):
    # The same three entries per task, as the script writes them, from text the client made.
    for start in range(0, N, B):
        payloads, records, members = [], [], []
        for i in range(start, min(N, start + B)):
            task, due = 'n-%d-%d' % (rnd, i), 1_800_000_000_000 + i
            payloads += [task, b'x' * 64]
            records += [task, 'p|%d|%d|0|0|c%d|' % (due, i, i)]
            members += [due, '%020d:%s' % (i, task)]
        batch = [encode(['MULTI']), encode(['HSET', K['payload'], *payloads]),
                 encode(['HSET', K['meta'], *records]), encode(['ZADD', K['due'], *members]),
                 encode(['EXEC'])]
        r.sock.sendall(b''.join(batch))
        for _ in batch:
            r._reply()


if os.environ.get('NATIVE') in ('1', 'only'):
    # redis-server on CPU 0 and this client on CPU 1 where there are two, as a server of its own.
    pin = ['taskset', '-c', '0'] if (os.cpu_count() or 1) >= 2 else []
    if pin:
        os.sched_setaffinity(0, {1})
    server, r = start_server(pin=pin)
    cpu = {'schedule.lua': [], 'native MULTI': []}
    try:
        schedule = load('schedule.lua')
        for rnd in range(ROUNDS):
            for label, run in [('schedule.lua', schedule_by_script), ('native MULTI', schedule_native)]:
                r.call('FLUSHALL')
                before = server_cpu()
                run(rnd)
                cpu[label].append((server_cpu() - before) * 1e6 / N)
                assert r.call('ZCARD', K['due']) == N, label
    finally:
        server.terminate()
        server.wait()
    for label, runs in cpu.items():
        print(f'{label:12s} {statistics.median(runs):6.2f} us/task of server CPU (INFO cpu)   '
              f'runs {[round(x, 2) for x in runs]}   (N={N}, calls of {B})')

total = 0
for label, runs in per_task.items():
    if not runs:
        continue
    median = statistics.median(runs)
    total += median
    print(f'{label:12s} {median:6.2f} us/task   runs {[round(x, 2) for x in runs]}')
if total:
    print(f'{"all three":12s} {total:6.2f} us/task   (N={N}, batch={B}, {sdir})')
