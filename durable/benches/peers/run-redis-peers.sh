#!/usr/bin/env bash
# tokio-wheel's Redis queue and apalis-redis, side by side: the same phases, in one run, on
# one redis-server (started here on a free loopback port, no persistence), ROUNDS times
# alternating, then the medians and ratios as a markdown table (BENCHMARKS.md quotes it).
#
#   bash durable/benches/peers/run-redis-peers.sh            # 3 rounds, every phase
#   ONLY=immediate,at_once bash durable/benches/peers/run-redis-peers.sh   # the rate table's rows
#   ROUNDS=1 TASKS=2000 SIZES=2000 AT_ONCE=5000 bash durable/benches/peers/run-redis-peers.sh
#
# Rows (each with _server_us, _client_us and _cpu_us: CPU per task, redis-server's INFO cpu
# and the peer process's getrusage): delayed_{TASKS}_w{1,4} (TASKS tasks due over the next
# 2 s while 1 or 4 workers run: _sched_per_s is the producers' rate), schedule_w{1,4}_per_s (16 producers' own rate while 1 or 4 workers consume),
# immediate_{n}_w{W}_per_s (n tasks scheduled due now by 16 producers, W workers running,
# first schedule to last ack; n in SIZES, default TASKS and 10 × TASKS),
# due_within_2s_{AT_ONCE}_done_s (AT_ONCE tasks due over the next 2 s, 4 workers: seconds
# until all are done; its ratio is apalis's time over ours), and phases BENCHMARKS.md explains.
#
# The apalis peer is a separate cargo project (durable/benches/peers/apalis): apalis-redis pins its
# own redis-rs, which stays out of tokio-wheel's dependency graph.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS="${ROUNDS:-3}"
export TASKS="${TASKS:-10000}" AT_ONCE="${AT_ONCE:-100000}"
target="${CARGO_TARGET_DIR:-$PWD/target}"

cargo build --release -p tokio-wheel-durable --features redis --example redis_bench >&2
CARGO_TARGET_DIR="$target/peers" cargo build --release --manifest-path durable/benches/peers/apalis/Cargo.toml >&2

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
# PIN=1 (default with 2+ cores): redis-server on CPU 0 and each peer's process on CPU 1, as
# on a server of its own (issue 30's measurement); PIN=0 lets the kernel place them.
pin_server=() pin_peer=()
if [ "${PIN:-1}" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    pin_server=(taskset -c 0) pin_peer=(taskset -c 1)
fi
"${pin_server[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$data" >/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$data"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
export REDIS_URL="redis://127.0.0.1:$port/"
echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on port $port; $ROUNDS rounds; TASKS=$TASKS AT_ONCE=$AT_ONCE; pinned: ${pin_server[*]:-no} / ${pin_peer[*]:-no}" >&2

results=$(mktemp)
for round in $(seq "$ROUNDS"); do
    echo "round $round: tokio-wheel" >&2
    "${pin_peer[@]}" "$target/release/examples/redis_bench" | sed -n 's/^RESULT /tokio-wheel /p' >>"$results"
    echo "round $round: apalis-redis" >&2
    "${pin_peer[@]}" "$target/peers/release/apalis-peer" | sed -n 's/^RESULT /apalis /p' >>"$results"
done

python3 - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    peer, metric, value = line.split(maxsplit=2)
    runs[(peer, metric)].append(value.strip())
def median(values):
    if not values:
        return "—"  # a phase only one side has (schedule_many)
    numbers = []
    for v in values:
        try:
            numbers.append(float(v.rstrip('/s')))
        except ValueError:
            return v  # e.g. "failed": show it as is
    return statistics.median(numbers)
metrics = []
for (_, metric) in runs:
    if metric not in metrics:
        metrics.append(metric)
# Lateness counts both ways: early (negative) is worse than late, so compare distances from 0.
lower_is_better = ('late_', 'early', 'idle', 'redelivery')
# Times to finish the same work: the ratio is theirs over ours (2× = done in half the time).
lower_time = ('due_within',)
print("| metric | tokio-wheel | apalis-redis | tokio-wheel vs apalis |")
print("|---|---|---|---|")
for metric in metrics:
    ours, theirs = median(runs[("tokio-wheel", metric)]), median(runs[("apalis", metric)])
    ratio = ""
    if isinstance(ours, float) and isinstance(theirs, float):
        if metric.startswith(lower_time) and ours:
            ratio = f"{theirs / ours:.2f}×"
        elif metric.startswith(lower_is_better):
            a, b = abs(ours), abs(theirs)
            ratio = "better" if a < b else ("equal" if a == b else "worse")
        elif metric.endswith('_us') and theirs:
            # CPU per task: ours over theirs, lower is better (issue 30: ≤ 0.67×).
            ratio = f"{ours / theirs:.2f}× CPU"
        elif theirs:
            ratio = f"{ours / theirs:.2f}×"
    fmt = lambda v: f"{v:g}" if isinstance(v, float) else v
    print(f"| {metric} | {fmt(ours)} | {fmt(theirs)} | {ratio} |")
PY
