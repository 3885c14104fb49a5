//! The durable queue shared across processes through Redis (feature `redis`).
//!
//! # Data layout
//!
//! Every key of a queue named `orders` carries the hash tag `{orders}`, so the whole queue
//! lives in one Redis Cluster slot and every script is atomic. With
//! [`partitions(n)`](super::Builder::partitions) the queue is `n` such key sets, each with its
//! own tag `{orders~p~k}` chosen so the partitions spread evenly over the cluster's slots (and
//! so its masters); a task lives in the partition its id hashes to (FNV-1a), and a worker
//! claims from every partition in turn. `tw:{orders}:config` records the partition count,
//! which every process of the queue must share.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `tw:{orders}:payload` | hash | id → payload |
//! | `tw:{orders}:meta` | hash | id → `state|due|seq|attempts|token|call|reason` (`call` names the schedule call that made it, so that call retried after a lost reply is recognised; a recurring schedule's `reason` is its definition) |
//! | `tw:{orders}:due` | sorted set | pending tasks and recurring schedules, score = due (ms), member = zero-padded seq + id, so ties go in schedule order |
//! | `tw:{orders}:inflight` | sorted set | in-flight ids, score = lease end (ms) |
//! | `tw:{orders}:dead` | sorted set | dead ids, score = time of death (ms) |
//! | `tw:{orders}:seq`, `tw:{orders}:token` | counters | schedule order, delivery tokens |
//! | `tw:{orders}:stats` | hash | the counters of [`QueueStats`] |
//! | `tw:{orders}:lateness` | list | lateness (ms) of the last 1000 claims |
//! | `tw:{orders}:done:<id>` | string, expires after one lease | `token|call|schedule-call` of the task's last finish, so that finish call, and the schedule call that made the task, retried after a lost reply, are recognised |
//! | `tw:{orders}:claim:<claimer>:<n>` | list, expires after one lease | `id, token, …` of one claim call, so a claim whose reply was lost is answered again |
//!
//! # One clock
//!
//! Every script reads the server's `TIME`: due times, lease ends and mark windows are judged
//! by it alone. `Task::after` sends the delay, not an instant. A worker keeps an estimate of
//! the server clock's offset from its own (from the `TIME` its claims return) only to arm its
//! wheel; when it wakes it asks the server, which decides what is due.
//!
//! # Claims
//!
//! A claim is one script: it moves at most [`EXPIRE_BATCH`] expired leases back to pending (or
//! to the dead letters), then moves at most [`CLAIM_BATCH`] due tasks to in-flight and returns
//! them *with their payloads*, plus the server's time, the next due time and next lease end. A
//! task is handed out only from that one atomic reply; a claim whose reply is lost is retried
//! with the same claim id and answered again from its record.
//!
//! A claimed task first waits in its stream's prefetch buffer under a lease the engine renews
//! (one script per lease/3 for all buffered claims); when the stream yields it, its lease is
//! set to a full lease from then. Dropping a stream returns what it buffered.
//!
//! # Wake-ups
//!
//! A script that makes a task pending publishes its due time on `tw:{orders}:wake` only when
//! it is earlier than every pending task — i.e. earlier than anything a worker knows of. Idle
//! workers re-arm their wheel to it (no call) and claim only when it is due. No worker polls.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{RedisFuture, Script};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::engine::{
    Consumer, Reply, Request, Settings, attach, far_future, now_ms, stale_cursor, system_time,
};
use super::inspect::{QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use super::recurring::Spec;
use super::{DeadLetter, Delivery, Due, Error, Outcome, Recurring, Route, Task, TaskId};
use tokio_wheel::Wheel;

/// Most tasks one claim script hands out.
const CLAIM_BATCH: usize = 256;
/// Most expired leases one claim script moves back; more follow in the next call at once.
pub(crate) const EXPIRE_BATCH: usize = 500;
/// Most entries one renewal, release or dead-letter page touches.
const PAGE: usize = 1000;
/// How long a command is retried while the server is unreachable before its error is
/// surfaced: rides out a restarting server or a connection that keeps dropping.
const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// The backoff between tries doubles from the first to the last.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(500));
/// How long a command may go unanswered before its connection counts as lost.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write waits for its replicas (`Builder::replicas`) before it reports them
/// missing: one `WAIT`, on the connection that made the write, so it must end inside
/// [`RESPONSE_TIMEOUT`] (a longer one fails first, as a lost connection: "timed out"). Not
/// several shorter ones in a row: after a reconnect or a failover a later one is answered by
/// a connection that made no write, which any replica satisfies at once (with 2 s slices the
/// cluster failover test lost a task).
const REPLICA_TIMEOUT: Duration = Duration::from_secs(4);
const _: () = assert!(REPLICA_TIMEOUT.as_millis() < RESPONSE_TIMEOUT.as_millis());
/// Shortest window in which a retried finish is recognised.
const MIN_MARK_WINDOW: Duration = Duration::from_secs(1);

/// Shared by every script: the server's clock, the metadata record, and targeted wake-ups.
macro_rules! lua {
    ($body:literal) => {
        concat!(
            r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(n) return string.format('%d', n) end
local function member(seq, id) return string.format('%020d', seq) .. ':' .. id end
-- A task's record: state|due|seq|attempts|token|call|reason, `call` naming the schedule
-- call that made it (so that call, retried after a lost reply, is recognised).
local function parse(m)
  local st, d, seq, att, tok, call, reason =
    string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  return st, tonumber(d), tonumber(seq), tonumber(att), tok, reason, call
end
local function record(st, d, seq, att, tok, reason, call)
  return st .. '|' .. fmt(d) .. '|' .. fmt(seq) .. '|' .. fmt(att) .. '|' .. tok .. '|' ..
    (call or '') .. '|' .. reason
end
-- Wakes one idle worker (one with room for more that found nothing to claim) to claim now;
-- the message names the idle set, so the worker knows which partition.
-- A worker that is gone has no subscriber on its channel: try the next.
local function wake_one(idle)
  for _ = 1, 8 do
    local worker = redis.call('ZPOPMIN', idle)
    if #worker == 0 then return end
    if redis.call('PUBLISH', worker[1], idle) > 0 then return end
  end
end
-- Before a task becomes pending at `due`: only if it is earlier than every pending task (so
-- earlier than anything a worker knows of), wake one idle worker if it is due already, or tell
-- every worker its due time (they re-arm their wheels; no call) if it is not.
local function announce(duekey, channel, idle, due, now)
  local head = redis.call('ZRANGE', duekey, 0, 0, 'WITHSCORES')
  if head[2] == nil or due < tonumber(head[2]) then
    if due <= now then wake_one(idle) else redis.call('PUBLISH', channel, fmt(due)) end
  end
end
"#,
            $body
        )
    };
}

/// KEYS: payload meta due dead seq idle mark inflight; ARGV: name id payload mode(at|after) ms
/// channel call. A call retried after a lost reply is recognised (by the task's record, or by the mark
/// its ack left) and answers 'OK' without acting again.
const SCHEDULE: &str = lua!(
    r#"
local now = now_ms()
local id = ARGV[2]
local due = tonumber(ARGV[5])
if ARGV[4] == 'after' then due = now + due end
local m = redis.call('HGET', KEYS[2], id)
if m then
  local st, d, seq, att, tok, reason, call = parse(m)
  if call == ARGV[7] then return 'OK' end -- this call, retried after a lost reply
  if st == 'i' then return 'INFLIGHT' end
  if st == 'p' or st == 'r' then redis.call('ZREM', KEYS[3], member(seq, id)) end
  if st == 'd' then redis.call('ZREM', KEYS[4], id) end
  if st == 'R' then redis.call('ZREM', KEYS[8], id) end
else
  local mark = redis.call('GET', KEYS[7])
  if mark and string.match(mark, '|([^|]*)$') == ARGV[7] then return 'OK' end
end
local seq = redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('HSET', KEYS[2], id, record('p', due, seq, 0, '0', '', ARGV[7]))
announce(KEYS[3], ARGV[6], KEYS[6], due, now)
redis.call('ZADD', KEYS[3], due, member(seq, id))
return 'OK'
"#
);

/// KEYS: meta due inflight dead token payload record previous-record idle stats lateness;
/// ARGV: name lease wanted max-attempts channel expire-batch worker-channel.
/// A worker left with room (it claimed fewer than it wanted) joins the idle set, to be woken
/// alone when a task becomes due; one that filled up while due tasks remain wakes another.
/// A due recurring schedule is claimed like a task (state `R`, under a lease) for the worker
/// to advance, and returned with attempt 0 and its definition in place of a payload.
/// Returns: now, next due, next lease end, more (1 if expired leases remain), then
/// id, due, attempt, token, payload for each task handed out.
const CLAIM: &str = lua!(
    r#"
local now = now_ms()
local lease = tonumber(ARGV[2])
redis.call('DEL', KEYS[8])
local out = {}
-- A task goes out with its payload, read in this same script.
local function hand_out(id, d, att, tok)
  table.insert(out, id)
  table.insert(out, fmt(d))
  table.insert(out, fmt(att))
  table.insert(out, tok)
  table.insert(out, redis.call('HGET', KEYS[6], id) or '')
end
local more = 0
local replay = redis.call('LRANGE', KEYS[7], 0, -1)
if #replay > 0 then
  -- This claim ran before and its reply was lost: hand out the same tasks again.
  for i = 1, #replay, 2 do
    local id, tok = replay[i], replay[i + 1]
    local m = redis.call('HGET', KEYS[1], id)
    if m then
      local st, d, seq, att, t, r = parse(m)
      if st == 'i' and t == tok then
        hand_out(id, d, att, tok)
      elseif st == 'R' and t == tok then
        table.insert(out, id)
        table.insert(out, fmt(d))
        table.insert(out, '0')
        table.insert(out, tok)
        table.insert(out, r)
      end
    end
  end
else
  local limit = tonumber(ARGV[6])
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  local announced = false
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[3], id)
    local m = redis.call('HGET', KEYS[1], id)
    if m then
      local st, d, seq, att, t, r, call = parse(m)
      if st == 'R' then
        -- A recurring schedule whose worker did not advance it: due again as it was.
        redis.call('HSET', KEYS[1], id, record('r', d, seq, 0, '0', r, call))
        redis.call('ZADD', KEYS[2], d, member(seq, id))
      elseif att >= tonumber(ARGV[4]) then
        redis.call('HSET', KEYS[1], id, record('d', d, seq, att, '0',
          'lease expired on delivery ' .. fmt(att) .. ' of ' .. ARGV[4], call))
        redis.call('ZADD', KEYS[4], now, id)
        redis.call('HINCRBY', KEYS[10], 'dead_lettered', 1)
      else
        redis.call('HINCRBY', KEYS[10], 'expired', 1)
        if not announced then
          announce(KEYS[2], ARGV[5], KEYS[9], now, now)
          announced = true
        end
        redis.call('HSET', KEYS[1], id, record('p', now, seq, att, '0', '', call))
        redis.call('ZADD', KEYS[2], now, member(seq, id))
      end
    end
  end
  if #expired == limit then more = 1 end
  local wanted = tonumber(ARGV[3])
  if wanted > 0 then
    local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, wanted)
    local late = {}
    for _, mem in ipairs(due) do
      redis.call('ZREM', KEYS[2], mem)
      local id = string.sub(mem, 22)
      local st, d, seq, att, t, r, call = parse(redis.call('HGET', KEYS[1], id))
      local tok = fmt(redis.call('INCR', KEYS[5]))
      redis.call('ZADD', KEYS[3], now + lease, id)
      redis.call('RPUSH', KEYS[7], id, tok)
      if st == 'r' then
        redis.call('HSET', KEYS[1], id, record('R', d, seq, 0, tok, r, call))
        table.insert(out, id)
        table.insert(out, fmt(d))
        table.insert(out, '0')
        table.insert(out, tok)
        table.insert(out, r)
      else
        att = att + 1
        redis.call('HSET', KEYS[1], id, record('i', d, seq, att, tok, '', call))
        hand_out(id, d, att, tok)
        table.insert(late, fmt(math.max(now - d, 0)))
      end
    end
    if #due > 0 then redis.call('PEXPIRE', KEYS[7], lease) end
    if #late > 0 then
      redis.call('HINCRBY', KEYS[10], 'delivered', #late)
      redis.call('RPUSH', KEYS[11], unpack(late))
      redis.call('LTRIM', KEYS[11], -1000, -1)
    end
    if #due < wanted then
      redis.call('ZADD', KEYS[9], now, ARGV[7])
    else
      redis.call('ZREM', KEYS[9], ARGV[7])
    end
  else
    redis.call('ZREM', KEYS[9], ARGV[7])
  end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) <= now and (wanted == 0 or #out == wanted * 5) then
    wake_one(KEYS[9])
  end
end
local nd = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local nl = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local head = {fmt(now), nd[2] or '', nl[2] or '', fmt(more)}
for _, v in ipairs(out) do table.insert(head, v) end
return head
"#
);

/// KEYS: payload meta inflight due dead mark idle stats;
/// ARGV: name id token outcome(ack|retry|dead) delay reason channel max-attempts window call.
/// A retry of the last attempt goes to the dead letters. Returns 1 if this call took effect
/// (now, or before when its reply was lost: the mark names the delivery and the call), 0 if
/// the lease was lost — including a second, different finish of the same delivery. The mark
/// also names the schedule call that made the task, so that call, retried after the task was
/// acked, does not make it again.
const FINISH: &str = lua!(
    r#"
local id, tok, outcome = ARGV[2], ARGV[3], ARGV[4]
local m = redis.call('HGET', KEYS[2], id)
if m then
  local st, d, seq, att, t, r, call = parse(m)
  if st == 'i' and t == tok then
    redis.call('ZREM', KEYS[3], id)
    if outcome == 'ack' then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('HINCRBY', KEYS[8], 'acked', 1)
    elseif outcome == 'retry' and att < tonumber(ARGV[8]) then
      local now = now_ms()
      local due = now + tonumber(ARGV[5])
      redis.call('HSET', KEYS[2], id, record('p', due, seq, att, '0', '', call))
      announce(KEYS[4], ARGV[7], KEYS[7], due, now)
      redis.call('ZADD', KEYS[4], due, member(seq, id))
      redis.call('HINCRBY', KEYS[8], 'retried', 1)
    else
      local reason = ARGV[6]
      if outcome == 'retry' then
        reason = 'retried on its last delivery (' .. fmt(att) .. ' of ' .. fmt(att) .. ')'
      end
      redis.call('HSET', KEYS[2], id, record('d', d, seq, att, '0', reason, call))
      redis.call('ZADD', KEYS[5], now_ms(), id)
      redis.call('HINCRBY', KEYS[8], 'dead_lettered', 1)
    end
    redis.call('SET', KEYS[6], tok .. '|' .. ARGV[10] .. '|' .. (call or ''), 'PX', ARGV[9])
    return 1
  end
end
local mark = redis.call('GET', KEYS[6])
if mark and string.match(mark, '^(%d+)|([^|]*)|') == tok and
   select(2, string.match(mark, '^(%d+)|([^|]*)|')) == ARGV[10] then
  return 1
end
return 0
"#
);

/// KEYS: meta inflight; ARGV: name lease mode(set|renew) (id token)…; sets each lease still
/// held by that token to end `lease` from now — `renew` (the engine's renewals and hand-outs)
/// never shortens one, so it cannot undo a user's longer `extend`. Returns 1 or 0 per pair.
const EXTEND: &str = lua!(
    r#"
local lease_end = now_ms() + tonumber(ARGV[2])
local out = {}
for i = 4, #ARGV, 2 do
  local ok = 0
  local m = redis.call('HGET', KEYS[1], ARGV[i])
  if m then
    local st, d, seq, att, t = parse(m)
    if st == 'i' and t == ARGV[i + 1] then
      if ARGV[3] == 'set' then
        redis.call('ZADD', KEYS[2], lease_end, ARGV[i])
      else
        redis.call('ZADD', KEYS[2], 'GT', lease_end, ARGV[i])
      end
      ok = 1
    end
  end
  table.insert(out, ok)
end
return out
"#
);

/// KEYS: meta inflight due idle stats; ARGV: name channel (id token)…; returns claims never
/// handed out: pending again at their due time, the delivery not counted.
const RELEASE: &str = lua!(
    r#"
local now = now_ms()
local n = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local m = redis.call('HGET', KEYS[1], id)
  if m then
    local st, d, seq, att, t, r, call = parse(m)
    if st == 'i' and t == ARGV[i + 1] then
      redis.call('ZREM', KEYS[2], id)
      redis.call('HSET', KEYS[1], id, record('p', d, seq, math.max(att - 1, 0), '0', '', call))
      announce(KEYS[3], ARGV[2], KEYS[4], d, now)
      redis.call('ZADD', KEYS[3], d, member(seq, id))
      n = n + 1
    end
  end
end
if n > 0 then redis.call('HINCRBY', KEYS[5], 'returned', n) end
return n
"#
);

/// KEYS: payload meta due dead idle inflight;
/// ARGV: name id op(cancel|reschedule|redrive|uncron) due channel.
const CHANGE: &str = lua!(
    r#"
local id = ARGV[2]
local now = now_ms()
local m = redis.call('HGET', KEYS[2], id)
if not m then return 0 end
local st, d, seq, att, tok, reason, call = parse(m)
local op = ARGV[3]
if op == 'cancel' and st == 'p' then
  redis.call('ZREM', KEYS[3], member(seq, id))
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return 1
elseif op == 'reschedule' and st == 'p' then
  local due = tonumber(ARGV[4])
  redis.call('ZREM', KEYS[3], member(seq, id))
  redis.call('HSET', KEYS[2], id, record('p', due, seq, att, '0', '', call))
  announce(KEYS[3], ARGV[5], KEYS[5], due, now)
  redis.call('ZADD', KEYS[3], due, member(seq, id))
  return 1
elseif op == 'redrive' and st == 'd' then
  redis.call('ZREM', KEYS[4], id)
  redis.call('HSET', KEYS[2], id, record('p', now, seq, 0, '0', '', call))
  announce(KEYS[3], ARGV[5], KEYS[5], now, now)
  redis.call('ZADD', KEYS[3], now, member(seq, id))
  return 1
elseif op == 'uncron' and (st == 'r' or st == 'R') then
  redis.call('ZREM', KEYS[3], member(seq, id))
  redis.call('ZREM', KEYS[6], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return 1
end
return 0
"#
);

/// KEYS: payload meta due inflight dead seq idle; ARGV: name id payload catch-up kind
/// (every|cron) definition (period ms | expression) channel.
/// Declares a recurring schedule. The same definition and payload again: kept as it is. Else
/// it is (re)made, due now, owing nothing up to now nor up to what a schedule it replaces had
/// made; the first worker to claim it computes its next occurrence.
const SCHEDULE_RECURRING: &str = lua!(
    r#"
local now = now_ms()
local id, catch, kind, def = ARGV[2], ARGV[4], ARGV[5], ARGV[6]
local last = now
local m = redis.call('HGET', KEYS[2], id)
if m then
  local st, d, seq, att, tok, reason, call = parse(m)
  if st == 'i' then return 'INFLIGHT' end
  if st == 'r' or st == 'R' then
    local c, l, k, rest = string.match(reason, '^([^|]*)|(%d+)|([^|]*)|(.*)$')
    local old_def = rest
    if k == 'every' then old_def = string.match(rest, '^([^|]*)') end
    if c == catch and k == kind and old_def == def and
       redis.call('HGET', KEYS[1], id) == ARGV[3] then
      return 'KEPT'
    end
    last = math.max(last, tonumber(l))
  end
  if st == 'p' or st == 'r' then redis.call('ZREM', KEYS[3], member(seq, id)) end
  if st == 'R' then redis.call('ZREM', KEYS[4], id) end
  if st == 'd' then redis.call('ZREM', KEYS[5], id) end
end
local spec = catch .. '|' .. fmt(last) .. '|' .. kind .. '|' .. def
if kind == 'every' then spec = spec .. '|' .. fmt(now) end
local seq = redis.call('INCR', KEYS[6])
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('HSET', KEYS[2], id, record('r', now, seq, 0, '0', spec, ''))
announce(KEYS[3], ARGV[7], KEYS[7], now, now)
redis.call('ZADD', KEYS[3], now, member(seq, id))
return 'OK'
"#
);

/// KEYS: payload meta due inflight seq idle; ARGV: name id token spec next-due channel
/// occurrence…. The worker holding the claimed recurring schedule `id` (by `token`) makes the
/// occurrences it owes as pending tasks `id@ms` (never one that exists), and moves it to its
/// next due time with its new definition. Returns 1, or 0 if the claim was lost.
const ADVANCE: &str = lua!(
    r#"
local now = now_ms()
local id, tok = ARGV[2], ARGV[3]
local m = redis.call('HGET', KEYS[2], id)
if not m then return 0 end
local st, d, seq, att, t, r, call = parse(m)
if st ~= 'R' or t ~= tok then return 0 end
local payload = redis.call('HGET', KEYS[1], id) or ''
for i = 7, #ARGV do
  local at = tonumber(ARGV[i])
  local occurrence = id .. '@' .. ARGV[i]
  if redis.call('HEXISTS', KEYS[2], occurrence) == 0 then
    local oseq = redis.call('INCR', KEYS[5])
    redis.call('HSET', KEYS[1], occurrence, payload)
    redis.call('HSET', KEYS[2], occurrence, record('p', at, oseq, 0, '0', '', ''))
    announce(KEYS[3], ARGV[6], KEYS[6], at, now)
    redis.call('ZADD', KEYS[3], at, member(oseq, occurrence))
  end
end
local next_due = tonumber(ARGV[5])
redis.call('ZREM', KEYS[4], id)
redis.call('HSET', KEYS[2], id, record('r', next_due, seq, 0, '0', ARGV[4], call))
announce(KEYS[3], ARGV[6], KEYS[6], next_due, now)
redis.call('ZADD', KEYS[3], next_due, member(seq, id))
return 1
"#
);

/// KEYS: meta due inflight dead payload; ARGV: name filter(pending|inflight|dead) after limit
/// payloads(0|1). One page of an index after the cursor task, by rank (`ZRANK`, then
/// `ZRANGE … LIMIT`): never the whole set. Returns 'STALE' if the cursor is not in that index,
/// else id, record, lease end (or ''), payload length (or the payload) per task.
const LIST: &str = lua!(
    r#"
local filter, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local index = KEYS[2]
if filter == 'inflight' then index = KEYS[3] elseif filter == 'dead' then index = KEYS[4] end
local start = 0
if after ~= '' then
  local cursor = after
  if filter == 'pending' then
    local m = redis.call('HGET', KEYS[1], after)
    if not m then return 'STALE' end
    local st, d, seq = parse(m)
    cursor = member(seq, after)
  end
  local rank = redis.call('ZRANK', index, cursor)
  if not rank then return 'STALE' end
  start = rank + 1
end
local out = {}
if limit <= 0 then return out end
for _, mem in ipairs(redis.call('ZRANGE', index, start, start + limit - 1)) do
  local id = mem
  if filter == 'pending' then id = string.sub(mem, 22) end
  local m = redis.call('HGET', KEYS[1], id)
  if m then
    table.insert(out, id)
    table.insert(out, m)
    table.insert(out, redis.call('ZSCORE', KEYS[3], id) or '')
    if ARGV[5] == '1' then
      table.insert(out, redis.call('HGET', KEYS[5], id) or '')
    else
      table.insert(out, fmt(redis.call('HSTRLEN', KEYS[5], id)))
    end
  end
end
return out
"#
);

/// KEYS: meta dead payload; ARGV: name older-than-ms batch. Deletes up to `batch` dead letters
/// that died more than `older-than` ago (server clock; 0: all of them). Returns how many.
const PURGE: &str = lua!(
    r#"
local upto = '+inf'
if tonumber(ARGV[2]) > 0 then upto = '(' .. fmt(now_ms() - tonumber(ARGV[2])) end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', upto, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
end
return #ids
"#
);

/// KEYS: meta inflight payload; ARGV: name id. Returns the record, the lease end (or '') and
/// the payload length, or nothing.
const GET: &str = lua!(
    r#"
local m = redis.call('HGET', KEYS[1], ARGV[2])
if not m then return {} end
return {m, redis.call('ZSCORE', KEYS[2], ARGV[2]) or '',
  fmt(redis.call('HSTRLEN', KEYS[3], ARGV[2]))}
"#
);

/// KEYS: due inflight dead stats lateness; ARGV: name. One consistent snapshot: the three
/// counts, the six counters, then the lateness window.
const STATS: &str = lua!(
    r#"
local out = {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3])}
for _, name in ipairs({'delivered', 'acked', 'retried', 'dead_lettered', 'expired', 'returned'}) do
  table.insert(out, tonumber(redis.call('HGET', KEYS[4], name) or '0'))
end
for _, late in ipairs(redis.call('LRANGE', KEYS[5], 0, -1)) do
  table.insert(out, tonumber(late))
end
return out
"#
);

/// Script arguments, each turned into Redis bytes once (so retries resend the same values).
macro_rules! redis_args {
    ($($value:expr),* $(,)?) => {{
        let mut args: Vec<Vec<u8>> = Vec::new();
        $(args.extend(redis::ToRedisArgs::to_redis_args(&$value));)*
        args
    }};
}

/// The keys of one partition of a queue.
struct Keys {
    prefix: String,
    /// The partition's hash slot (Redis Cluster), where `WAIT` is sent.
    slot: u16,
    payload: String,
    meta: String,
    due: String,
    inflight: String,
    dead: String,
    seq: String,
    token: String,
    /// Workers with room for more that found nothing due: the one to wake for a due task.
    idle: String,
    channel: String,
    /// The partition's counters (a hash).
    stats: String,
    /// The lateness of the partition's latest claims (a capped list).
    lateness: String,
}

impl Keys {
    fn new(tag: &str) -> Keys {
        let prefix = format!("tw:{{{tag}}}:");
        let key = |part: &str| format!("{prefix}{part}");
        Keys {
            slot: slot_of(tag.as_bytes()),
            payload: key("payload"),
            meta: key("meta"),
            due: key("due"),
            inflight: key("inflight"),
            dead: key("dead"),
            seq: key("seq"),
            token: key("token"),
            idle: key("idle"),
            channel: key("wake"),
            stats: key("stats"),
            lateness: key("lateness"),
            prefix,
        }
    }

    /// Where the last finish of task `id` is remembered for a while (which delivery, which
    /// call, and which schedule call made the task).
    fn mark(&self, id: &str) -> String {
        format!("{}done:{id}", self.prefix)
    }

    /// The keys the stats script reads.
    fn stats_keys(&self) -> [&str; 5] {
        [
            &self.due,
            &self.inflight,
            &self.dead,
            &self.stats,
            &self.lateness,
        ]
    }

    /// Where one claim call records what it handed out.
    fn claim_record(&self, claimer: &str, call: u64) -> String {
        format!("{}claim:{claimer}:{call}", self.prefix)
    }
}

/// Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) modulo 16384.
fn slot_of(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// The most partitions a queue may have.
pub(crate) const MAX_PARTITIONS: usize = 256;

/// The hash tags of a queue's partitions. One partition keeps the tag `name` (the layout of
/// a queue without partitions). With `n` partitions, partition `p`'s tag is `name~p~k` with
/// the smallest `k` whose slot falls in the `p`-th of `n` equal slices of the 16384 slots, so
/// the partitions spread evenly over the slot space and so over the cluster's masters.
fn partition_tags(name: &str, n: usize) -> Vec<String> {
    if n <= 1 {
        return vec![name.to_owned()];
    }
    (0..n)
        .map(|p| {
            let (low, high) = (p * 16_384 / n, (p + 1) * 16_384 / n);
            (0..)
                .map(|k| format!("{name}~{p}~{k}"))
                .find(|tag| (low..high).contains(&usize::from(slot_of(tag.as_bytes()))))
                .expect("some suffix lands in every slice")
        })
        .collect()
}

/// Which partition task `id` lives in (FNV-1a: the same in every process and version).
fn partition_of(id: &str, partitions: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in id.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % partitions as u64) as usize
}

struct Scripts {
    schedule: Script,
    claim: Script,
    finish: Script,
    extend: Script,
    release: Script,
    change: Script,
    schedule_recurring: Script,
    advance: Script,
    list: Script,
    purge: Script,
    get: Script,
    stats: Script,
}

/// A connection to one server (reconnecting) or to a cluster (following MOVED and ASK,
/// refreshing its slot map).
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// How to reach the server(s), from [`Builder`](super::Builder).
pub(crate) struct Target {
    /// One URL (a server), or the seed nodes of a cluster.
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) partitions: usize,
    pub(crate) replicas: usize,
    /// PEM root certificates to trust for `rediss://` (else the system's).
    pub(crate) tls_roots: Option<Vec<u8>>,
}

/// One queue's connection, partitions, scripts and settings: what the engine and every
/// handle and delivery of the queue call directly.
pub(crate) struct Shared {
    parts: Vec<Keys>,
    scripts: Scripts,
    connection: Connection,
    settings: Settings,
    /// Writes return once this many replicas have them (`WAIT`).
    replicas: usize,
}

/// Whether trying again may succeed: a lost or refused connection, a timeout, a server still
/// loading its data after a restart, a cluster moving slots. Anything else (a script error,
/// bad data, refused credentials) is final.
fn is_transient(error: &redis::RedisError) -> bool {
    !matches!(error.retry_method(), redis::RetryMethod::NoRetry)
}

/// A Redis error as the queue reports it: refused credentials and certificates are
/// [`Error::Denied`] (final, at once), an unreachable server [`Error::Unreachable`]. The
/// redis crate's messages name the server, never the credentials.
fn classify(error: &redis::RedisError) -> Error {
    let text = error.to_string();
    let lower = text.to_lowercase();
    let denied = matches!(error.kind(), redis::ErrorKind::AuthenticationFailed)
        || lower.contains("wrongpass")
        || lower.contains("noauth")
        || lower.contains("noperm")
        || lower.contains("certificate")
        || lower.contains("invalid peer")
        || lower.contains("handshake");
    if denied {
        Error::Denied(text)
    } else if is_transient(error) || error.is_connection_refusal() || error.is_io_error() {
        Error::Unreachable(text)
    } else {
        Error::Io(text)
    }
}

/// Runs a Redis operation, retrying with backoff while the server is unreachable. A refusal
/// is final at once, though the redis crate would retry it: a reconnect that the server
/// refuses (the password changed) is not a server that is down.
async fn with_retries<T, F, Fut>(mut operation: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let start = Instant::now();
    let mut delay = RETRY_BACKOFF.0;
    loop {
        match operation().await {
            Ok(value) => return Ok(value),
            Err(error) if !is_transient(&error) || classify(&error).is_denied() => {
                return Err(match classify(&error) {
                    Error::Unreachable(text) => Error::Io(text),
                    other => other,
                });
            }
            Err(error) => {
                if start.elapsed() >= RETRY_BUDGET {
                    return Err(Error::Unreachable(error.to_string()));
                }
                tracing::debug!(%error, "redis unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_BACKOFF.1);
            }
        }
    }
}

/// A client for one server, trusting `tls_roots` for `rediss://` if given.
fn client(url: &str, tls_roots: Option<&[u8]>) -> Result<redis::Client, Error> {
    let invalid = |e: redis::RedisError| Error::Invalid(format!("a Redis URL cannot be used: {e}"));
    match tls_roots {
        #[cfg(feature = "redis-tls")]
        Some(roots) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.to_vec()),
            },
        )
        .map_err(invalid),
        _ => redis::Client::open(url).map_err(invalid),
    }
}

async fn connect(target: &Target) -> Result<Connection, Error> {
    if !target.cluster {
        let client = client(&target.urls[0], target.tls_roots.as_deref())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_number_of_retries(2)
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_max_delay(Duration::from_secs(2));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| classify(&e))?;
        return Ok(Connection::Single(connection));
    }
    #[cfg_attr(not(feature = "redis-tls"), allow(unused_mut))]
    let mut builder =
        redis::cluster::ClusterClient::builder(target.urls.iter().map(String::as_str))
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(6)
            .max_retry_wait(500);
    #[cfg(feature = "redis-tls")]
    if let Some(roots) = &target.tls_roots {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(roots.clone()),
        });
    }
    let client = builder
        .build()
        .map_err(|e| Error::Invalid(format!("the Redis Cluster URLs cannot be used: {e}")))?;
    let connection = client
        .get_async_connection()
        .await
        .map_err(|e| classify(&e))?;
    Ok(Connection::Cluster(connection))
}

/// Connects (failing with [`Error::Unreachable`] if it cannot, [`Error::Denied`] at once if
/// the server refuses the credentials or the client its certificate), checks the queue's
/// partition count, and starts the engine.
pub(crate) async fn start(
    target: Target,
    name: &str,
    settings: Settings,
    wheel: &Wheel,
) -> Result<(mpsc::UnboundedSender<Request>, Arc<Shared>), Error> {
    if target.urls.is_empty() {
        return Err(Error::Invalid("no Redis URL given".into()));
    }
    if !(1..=MAX_PARTITIONS).contains(&target.partitions) {
        return Err(Error::Invalid(format!(
            "partitions must be between 1 and {MAX_PARTITIONS} (got {})",
            target.partitions
        )));
    }
    let mut connection = connect(&target).await?;
    let _: () = redis::cmd("PING")
        .query_async(&mut connection)
        .await
        .map_err(|e| classify(&e))?;
    // Every process of a queue must agree on its partitions, or tasks would be lost in
    // partitions nobody claims from.
    let config = format!("tw:{{{name}}}:config");
    let (_, agreed): (bool, usize) = redis::pipe()
        .hset_nx(&config, "partitions", target.partitions)
        .hget(&config, "partitions")
        .query_async(&mut connection)
        .await
        .map_err(|e| classify(&e))?;
    if agreed != target.partitions {
        return Err(Error::Invalid(format!(
            "queue {name:?} has {agreed} partitions; this handle asked for {}",
            target.partitions
        )));
    }
    let shared = Arc::new(Shared {
        parts: partition_tags(name, target.partitions)
            .iter()
            .map(|tag| Keys::new(tag))
            .collect(),
        scripts: Scripts {
            schedule: Script::new(SCHEDULE),
            claim: Script::new(CLAIM),
            finish: Script::new(FINISH),
            extend: Script::new(EXTEND),
            release: Script::new(RELEASE),
            change: Script::new(CHANGE),
            schedule_recurring: Script::new(SCHEDULE_RECURRING),
            advance: Script::new(ADVANCE),
            list: Script::new(LIST),
            purge: Script::new(PURGE),
            get: Script::new(GET),
            stats: Script::new(STATS),
        },
        connection,
        settings,
        replicas: target.replicas,
    });
    let (requests, receiver) = mpsc::unbounded_channel();
    let (wake_sender, wakes) = mpsc::unbounded_channel();
    let attachment = attach(wheel);
    let claimer = TaskId::generate().0;
    let own_channel = format!("tw:{{{name}}}:wake:{claimer}");
    let mut clients = Vec::new();
    for url in &target.urls {
        clients.push(client(url, target.tls_roots.as_deref())?);
    }
    let channels: Vec<String> = shared.parts.iter().map(|k| k.channel.clone()).collect();
    let idle: Vec<String> = shared.parts.iter().map(|k| k.idle.clone()).collect();
    check_permissions(&shared, &channels, &own_channel).await?;
    let listener = attachment.runtime.spawn(listen(
        clients,
        channels,
        idle,
        own_channel.clone(),
        wake_sender,
    ));
    let parts = shared.parts.len();
    let engine = RedisEngine {
        shared: shared.clone(),
        requests: receiver,
        handle: requests.downgrade(),
        consumers: Vec::new(),
        wheel: wheel.clone(),
        shutdown: attachment.shutdown,
        wakes,
        own_channel,
        claimer,
        claims: 0,
        parts: (0..parts).map(|_| PartState::default()).collect(),
        rotation: 0,
        demand: false,
        retry_at: None,
        buffered: HashMap::new(),
        held: HashMap::new(),
        handouts: Vec::new(),
        renew_at: None,
        purge_at: shared
            .settings
            .purge_every()
            .map(|every| Instant::now() + every),
        closing: Vec::new(),
        close_deadline: None,
        closing_streams: false,
    };
    attachment.runtime.spawn(async move {
        engine.run().await;
        listener.abort();
    });
    Ok((requests, shared))
}

/// A user the server lets connect may still lack a permission the queue needs: finds out
/// at open ([`Error::Denied`] with the server's NOPERM), not at some later call — or never,
/// for a worker that may not subscribe and so waits for wake-ups forever. A read-only script
/// checks scripts and keys; an empty message on every wake channel checks channels (PUBLISH
/// needs the same permission as SUBSCRIBE, whose refusal the redis crate does not report;
/// listeners ignore empty messages, and this worker's own channel has no listener yet).
async fn check_permissions(shared: &Shared, channels: &[String], own: &str) -> Result<(), Error> {
    let _: Vec<u64> = shared
        .invoke(
            &shared.scripts.stats,
            &shared.parts[0].stats_keys(),
            redis_args!["tw-stats"],
        )
        .await?;
    // One command per channel (a cluster pipeline wants a single slot), sent together.
    let probes = channels
        .iter()
        .map(String::as_str)
        .chain([own])
        .map(|channel| {
            with_retries(move || {
                let mut connection = shared.connection.clone();
                let mut probe = redis::cmd("PUBLISH");
                probe.arg(channel).arg("");
                async move { probe.query_async::<()>(&mut connection).await }
            })
        });
    futures::future::try_join_all(probes).await?;
    Ok(())
}

/// What the wake channels tell the engine.
enum Wake {
    /// This worker was picked to claim a task that is due in this partition (on its own
    /// channel).
    Claim(usize),
    /// A task of this partition became pending at this server time, earlier than any other.
    Due(usize, u64),
    /// (Re)subscribed: anything may have happened while away.
    Refresh,
}

/// Subscribes to the partitions' wake channels and this worker's own, resubscribing after
/// connection loss (trying each node in turn: in a cluster, a message published on any node
/// reaches every node), and passes every message to the engine.
async fn listen(
    clients: Vec<redis::Client>,
    channels: Vec<String>,
    idle: Vec<String>,
    own: String,
    wake: mpsc::UnboundedSender<Wake>,
) {
    let mut delay = Duration::from_millis(50);
    for attempt in 0.. {
        let client = &clients[attempt % clients.len()];
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            let mut all: Vec<&str> = channels.iter().map(String::as_str).collect();
            all.push(&own);
            if pubsub.subscribe(&all).await.is_ok() {
                delay = Duration::from_millis(50);
                if wake.send(Wake::Refresh).is_err() {
                    return;
                }
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let channel = message.get_channel_name();
                    // Anything else (the empty messages of `check_permissions`) is no news.
                    let event = if channel == own {
                        let key: String = message.get_payload().unwrap_or_default();
                        idle.iter().position(|k| *k == key).map(Wake::Claim)
                    } else {
                        let part = channels.iter().position(|c| c == channel).unwrap_or(0);
                        let at = message.get_payload::<u64>();
                        at.ok().map(|at| Wake::Due(part, at))
                    };
                    if let Some(event) = event
                        && wake.send(event).is_err()
                    {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// One claim call's answer.
struct Claim {
    server_now: u64,
    next_due: Option<u64>,
    next_lease: Option<u64>,
    more: bool,
    /// id, due, attempt, token, payload.
    tasks: Vec<(String, u64, u32, u64, Vec<u8>)>,
}

/// What the engine knows of one partition.
#[derive(Default)]
struct PartState {
    /// That partition's server clock minus this process's wall clock (ms), from its last
    /// claim: used only to arm the wheel, never to decide what is due.
    offset_ms: i64,
    /// Server times: the earliest pending task and lease end known.
    next_due: Option<u64>,
    next_lease: Option<u64>,
    /// Expired leases remain beyond the last claim's batch.
    more: bool,
    /// Learn the heads again (at start, after a resubscribe, after an error, when woken).
    refresh: bool,
}

impl PartState {
    fn server_now(&self) -> u64 {
        now_ms().saturating_add_signed(self.offset_ms)
    }
}

struct RedisEngine {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    handle: mpsc::WeakUnboundedSender<Request>,
    consumers: Vec<Consumer>,
    wheel: Wheel,
    shutdown: tokio_wheel::Stopped,
    wakes: mpsc::UnboundedReceiver<Wake>,
    /// Names this engine's claim records; `claims` counts its claim calls.
    claimer: String,
    /// Where the server wakes this worker alone.
    own_channel: String,
    claims: u64,
    parts: Vec<PartState>,
    /// Which partition claims first next time: each gets first pick in turn.
    rotation: usize,
    /// A stream asked for more since the last claim.
    demand: bool,
    retry_at: Option<Instant>,
    /// Claims waiting in a stream's buffer: token → (id, when the claim was sent).
    buffered: HashMap<u64, (String, Instant)>,
    /// Handed out, neither finished nor dropped: token → id.
    held: HashMap<u64, String>,
    /// Handed out this turn after waiting in a buffer: their leases restart.
    handouts: Vec<(String, u64)>,
    renew_at: Option<Instant>,
    /// Retention: when to purge old dead letters next.
    purge_at: Option<Instant>,
    closing: Vec<Reply<()>>,
    close_deadline: Option<Instant>,
    /// `close()` was called: end the streams and return their buffers in this turn.
    closing_streams: bool,
}

impl RedisEngine {
    async fn run(mut self) {
        for part in &mut self.parts {
            part.refresh = true;
        }
        loop {
            if self.shutdown.is_stopped() || self.close_done() {
                break;
            }
            if self.retry_at.is_none_or(|at| at <= Instant::now()) {
                match self.claim_round().await {
                    Ok(()) => self.retry_at = None,
                    Err(error) => {
                        tracing::warn!(%error, "claiming from redis failed; retrying");
                        for part in &mut self.parts {
                            part.refresh = true;
                        }
                        self.retry_at = Some(Instant::now() + Duration::from_millis(200));
                    }
                }
            }
            self.renew_if_due();
            self.purge_if_due();
            let at = self.next_wake();
            let sleep = self.wheel.sleep_until(at.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                () = &mut self.shutdown => break,
                request = self.requests.recv() => match request {
                    Some(request) => {
                        self.handle_request(request);
                        // Take whatever else is queued in the same turn.
                        while let Ok(request) = self.requests.try_recv() {
                            self.handle_request(request);
                        }
                        self.start_handed_out_leases();
                    }
                    None => break,
                },
                Some(wake) = self.wakes.recv() => self.woken(wake),
                () = sleep, if at.is_some() => {}
            }
            if std::mem::take(&mut self.closing_streams) {
                self.close_streams().await;
            }
            self.consumers.retain(|c| !c.sender.is_closed());
        }
        // What is already queued first: a delivery its stream yielded just before the stop is
        // held, not buffered, and must not be returned.
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::HandedOut(_)
                | Request::Dropped(_)
                | Request::Release(_)
                | Request::Finishing(_)
                | Request::Close(_) => self.handle_request(request),
                _ => {} // dropping its reply answers `Closed`
            }
        }
        self.close_streams().await;
        for reply in self.closing.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    fn close_done(&self) -> bool {
        self.close_deadline
            .is_some_and(|deadline| Instant::now() >= deadline || self.held.is_empty())
    }

    fn wanted(&self) -> usize {
        if self.close_deadline.is_some() {
            return 0;
        }
        self.consumers
            .iter()
            .filter(|c| c.wants())
            .map(|c| c.credits.load(Ordering::Acquire))
            .sum()
    }

    /// Whether partition `p` has something for a claim to do now.
    fn should_claim(&self, p: usize, wanted: bool) -> bool {
        let part = &self.parts[p];
        let now = part.server_now();
        part.refresh
            || part.more
            || (wanted && (self.demand || part.next_due.is_some_and(|due| due <= now)))
            || part.next_lease.is_some_and(|end| end <= now)
    }

    fn next_wake(&self) -> Option<Instant> {
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        if self.parts.iter().any(|p| p.more || p.refresh) {
            return Some(Instant::now());
        }
        let wanted = self.wanted() > 0;
        let server = self.parts.iter().filter_map(|part| {
            let due = part.next_due.filter(|_| wanted);
            let at = match (due, part.next_lease) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }?;
            Some(Instant::now() + Duration::from_millis(at.saturating_sub(part.server_now())))
        });
        server
            .chain(
                [self.renew_at, self.purge_at, self.close_deadline]
                    .into_iter()
                    .flatten(),
            )
            .min()
    }

    fn woken(&mut self, wake: Wake) {
        match wake {
            Wake::Due(p, due) => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.next_due = Some(part.next_due.map_or(due, |known| known.min(due)));
                }
            }
            Wake::Claim(p) => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.refresh = true;
                }
            }
            Wake::Refresh => {
                for part in &mut self.parts {
                    part.refresh = true;
                }
            }
        }
    }

    /// Claims from each partition that has something to do, the first pick rotating, and
    /// shares what the streams want evenly among them: with a backlog everywhere and a
    /// prefetch of 8 over 6 partitions, each gets 1 or 2 of a round's claims, so no partition
    /// waits behind another's backlog.
    async fn claim_round(&mut self) -> Result<(), Error> {
        let count = self.parts.len();
        let start = self.rotation % count;
        self.rotation = self.rotation.wrapping_add(1);
        let wanted_any = self.wanted() > 0;
        let chosen: Vec<usize> = (0..count)
            .map(|step| (start + step) % count)
            .filter(|&p| self.should_claim(p, wanted_any))
            .collect();
        for (i, &p) in chosen.iter().enumerate() {
            let left = chosen.len() - i;
            let share = self.wanted().div_ceil(left);
            // Chosen only for its due tasks, and the credits are gone: nothing to do there.
            if share == 0 && !self.should_claim(p, false) {
                continue;
            }
            self.claim(p, share).await?;
        }
        if !chosen.is_empty() {
            self.demand = false;
        }
        Ok(())
    }

    /// Claims at most `share` tasks from partition `p` (and never more than the streams
    /// want), hands them out, and learns when to look there again.
    async fn claim(&mut self, p: usize, share: usize) -> Result<(), Error> {
        let shared = self.shared.clone();
        let keys = &shared.parts[p];
        let settings = &shared.settings;
        let wanted = self.wanted().min(share).min(CLAIM_BATCH);
        let previous = keys.claim_record(&self.claimer, self.claims);
        self.claims += 1;
        let record = keys.claim_record(&self.claimer, self.claims);
        let sent = Instant::now();
        let sent_wall = now_ms();
        let reply: Vec<Vec<u8>> = shared
            .invoke(
                &shared.scripts.claim,
                &[
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.token,
                    &keys.payload,
                    &record,
                    &previous,
                    &keys.idle,
                    &keys.stats,
                    &keys.lateness,
                ],
                redis_args![
                    "tw-claim",
                    settings.lease_ms(),
                    wanted,
                    settings.policy.attempts(),
                    &keys.channel,
                    EXPIRE_BATCH,
                    &self.own_channel
                ],
            )
            .await?;
        let claim = parse_claim(reply)?;
        // The server read its clock about half a round trip after we sent.
        let midpoint = sent_wall.saturating_add(delay_ms_floor(sent.elapsed() / 2));
        let part = &mut self.parts[p];
        part.offset_ms = claim.server_now as i64 - midpoint as i64;
        part.next_due = claim.next_due;
        part.next_lease = claim.next_lease;
        part.more = claim.more;
        part.refresh = false;
        let Some(engine) = self.handle.upgrade() else {
            return Ok(());
        };
        let mut consumer = 0;
        let mut schedules = Vec::new();
        for (id, due, attempt, token, payload) in claim.tasks {
            if attempt == 0 {
                schedules.push((id, token, payload)); // a recurring schedule to advance
                continue;
            }
            while consumer < self.consumers.len() && !self.consumers[consumer].wants() {
                consumer += 1;
            }
            self.buffered.insert(token, (id.clone(), sent));
            let delivery = Delivery::new(
                TaskId::from(id),
                payload,
                attempt,
                system_time(due),
                token,
                engine.clone(),
                Route::Redis(self.shared.clone()),
            );
            // A stream that vanished meanwhile drops the delivery, and its drop returns it.
            if let Some(target) = self.consumers.get(consumer) {
                target.credits.fetch_sub(1, Ordering::AcqRel);
                let _ = target.sender.send(delivery);
            }
        }
        if !self.buffered.is_empty() && self.renew_at.is_none() {
            self.renew_at = Some(Instant::now() + settings.renew_every());
        }
        for (id, token, definition) in schedules {
            let spec = String::from_utf8(definition)
                .map_err(|_| Error::Corrupt(format!("recurring schedule {id:?} is damaged")))
                .and_then(|text| Spec::decode(&text));
            let mut spec = match spec {
                Ok(spec) => spec,
                Err(error) => {
                    tracing::error!(%error, "a recurring schedule cannot be read; left as it is");
                    continue;
                }
            };
            let (owed, next_due) = spec.advance(claim.server_now);
            shared.advance(&id, token, &spec, next_due, &owed).await?;
            // Its occurrences are due now: claim them.
            self.parts[p].refresh = true;
        }
        Ok(())
    }

    /// One renewal for every delivery handed out this turn: their leases run from now.
    fn start_handed_out_leases(&mut self) {
        if self.handouts.is_empty() {
            return;
        }
        let handouts = std::mem::take(&mut self.handouts);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if let Err(error) = shared.extend(&handouts, shared.settings.lease, false).await {
                tracing::warn!(%error, "starting leases at hand-out failed");
            }
        });
    }

    /// Every lease/3: renews the buffered claims (and, with keep-alive, the held deliveries).
    fn renew_if_due(&mut self) {
        let Some(at) = self.renew_at else { return };
        if at > Instant::now() {
            return;
        }
        let mut tokens: Vec<(String, u64)> = self
            .buffered
            .iter()
            .map(|(&token, (id, _))| (id.clone(), token))
            .collect();
        if self.shared.settings.keep_alive {
            tokens.extend(self.held.iter().map(|(&token, id)| (id.clone(), token)));
        }
        self.renew_at =
            (!tokens.is_empty()).then(|| Instant::now() + self.shared.settings.renew_every());
        let shared = self.shared.clone();
        let lease = shared.settings.lease;
        tokio::spawn(async move {
            if let Err(error) = shared.extend(&tokens, lease, false).await {
                tracing::warn!(%error, "renewing leases failed");
            }
        });
    }

    /// Retention: purges the dead letters older than the retention, in the background.
    fn purge_if_due(&mut self) {
        let Some(at) = self.purge_at else { return };
        if at > Instant::now() {
            return;
        }
        let settings = &self.shared.settings;
        self.purge_at = settings.purge_every().map(|every| Instant::now() + every);
        let keep = super::delay_ms(settings.retention.unwrap_or_default()).max(1);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            match shared.purge_dead(keep).await {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(removed, "purged old dead letters"),
                Err(error) => tracing::warn!(%error, "purging old dead letters failed"),
            }
        });
    }

    /// Ends the streams and returns what they buffered: when `close` is called (before it waits
    /// for held deliveries), at shutdown, or when every handle is gone.
    async fn close_streams(&mut self) {
        for consumer in self.consumers.drain(..) {
            consumer.close();
        }
        let buffered: Vec<(String, u64)> = self
            .buffered
            .drain()
            .map(|(token, (id, _))| (id, token))
            .collect();
        if buffered.is_empty() {
            return;
        }
        let release = self.shared.release(&buffered);
        match tokio::time::timeout(Duration::from_secs(5), release).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "returning buffered claims failed"),
            Err(_) => tracing::warn!("returning buffered claims timed out"),
        }
    }

    fn handle_request(&mut self, request: Request) {
        let shared = self.shared.clone();
        match request {
            Request::Subscribe(consumer) => {
                if self.close_deadline.is_some() {
                    consumer.close();
                } else {
                    self.consumers.push(consumer);
                }
            }
            Request::Demand => self.demand = true,
            Request::Close(reply) => {
                self.closing.push(reply);
                if self.close_deadline.is_none() {
                    self.close_deadline = Some(Instant::now() + self.shared.settings.close_timeout);
                    // This turn ends the streams and returns their buffers, before the close
                    // waits for held deliveries.
                    self.closing_streams = true;
                }
            }
            Request::HandedOut(token) => {
                let Some((id, claimed)) = self.buffered.remove(&token) else {
                    return;
                };
                self.held.insert(token, id.clone());
                let lease = shared.settings.lease;
                if shared.settings.keep_alive && self.renew_at.is_none() {
                    self.renew_at = Some(Instant::now() + shared.settings.renew_every());
                }
                // The claim set the lease to end a lease after it was sent; if the delivery
                // waited in the buffer for more than a thousandth of a lease, restart it now
                // (batched with the turn's other hand-outs).
                if claimed.elapsed() > lease / 1000 {
                    self.handouts.push((id, token));
                }
            }
            Request::Dropped(token) => {
                self.held.remove(&token);
            }
            Request::Release(token) => {
                if let Some((id, _)) = self.buffered.remove(&token) {
                    tokio::spawn(async move {
                        if let Err(error) = shared.release(&[(id, token)]).await {
                            tracing::warn!(%error, "returning a buffered claim failed");
                        }
                    });
                }
            }
            Request::Finishing(token) => {
                self.held.remove(&token);
            }
            // Handles and deliveries of a Redis queue call the server directly.
            Request::Extend(..)
            | Request::Schedule(..)
            | Request::Cancel(..)
            | Request::Reschedule(..)
            | Request::Redrive(..)
            | Request::Len(..)
            | Request::DeadLetters(..)
            | Request::Ack(..)
            | Request::Retry(..)
            | Request::Fail(..)
            | Request::Get(..)
            | Request::List(..)
            | Request::DeadPage(..)
            | Request::Purge { .. }
            | Request::Stats(..)
            | Request::ScheduleRecurring(..)
            | Request::CancelRecurring(..) => debug_assert!(false, "routed to the server directly"),
        }
    }
}

/// A name for one call, unique across processes: its retries carry it, so a store step
/// that already ran for it is recognised.
fn call_id() -> String {
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let process = PROCESS.get_or_init(|| TaskId::generate().0);
    format!("{process}.{:x}", CALLS.fetch_add(1, Ordering::Relaxed))
}

fn delay_ms_floor(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A number in a script's reply (Redis prints scores as doubles, "1.7e+12" for some).
fn number(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.parse::<u64>()
        .ok()
        .or_else(|| text.parse::<f64>().ok().map(|f| f as u64))
}

fn parse_claim(reply: Vec<Vec<u8>>) -> Result<Claim, Error> {
    let bad = || Error::Io("unexpected reply from the claim script".into());
    let mut fields = reply.into_iter();
    let mut next = || fields.next().ok_or_else(bad);
    let server_now = number(&next()?).ok_or_else(bad)?;
    let next_due = number(&next()?);
    let next_lease = number(&next()?);
    let more = number(&next()?) == Some(1);
    let mut tasks = Vec::new();
    while let Some(id) = fields.next() {
        let mut field = || fields.next().ok_or_else(bad);
        let due = number(&field()?).ok_or_else(bad)?;
        let attempt = number(&field()?).ok_or_else(bad)? as u32;
        let token = number(&field()?).ok_or_else(bad)?;
        let payload = field()?;
        let id = String::from_utf8(id).map_err(|_| bad())?;
        tasks.push((id, due, attempt, token, payload));
    }
    Ok(Claim {
        server_now,
        next_due,
        next_lease,
        more,
        tasks,
    })
}

impl Shared {
    /// The keys of the partition task `id` lives in.
    fn keys_for(&self, id: &str) -> &Keys {
        &self.parts[partition_of(id, self.parts.len())]
    }

    /// Runs one of the queue's scripts, retrying while the server is unreachable.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T, Error> {
        with_retries(|| {
            let mut connection = self.connection.clone();
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(*key);
            }
            for arg in &args {
                invocation.arg(arg.as_slice());
            }
            async move { invocation.invoke_async(&mut connection).await }
        })
        .await
    }

    /// Runs a script that writes to partition `part`, then, with
    /// [`replicas`](super::Builder::replicas), waits until that many replicas have the write.
    async fn invoke_write<T: redis::FromRedisValue>(
        &self,
        part: &Keys,
        script: &Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T, Error> {
        let value = self.invoke(script, keys, args).await?;
        self.wait_for_replicas(part).await?;
        Ok(value)
    }

    /// `WAIT replicas timeout` on the connection that wrote to `part` (on a cluster: its
    /// master), or nothing without replicas asked for.
    async fn wait_for_replicas(&self, part: &Keys) -> Result<(), Error> {
        if self.replicas == 0 {
            return Ok(());
        }
        let timeout = delay_ms_floor(REPLICA_TIMEOUT);
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(timeout);
        let acknowledged: usize = match &self.connection {
            Connection::Single(connection) => {
                let mut connection = connection.clone();
                wait.query_async(&mut connection)
                    .await
                    .map_err(|e| classify(&e))?
            }
            Connection::Cluster(connection) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let mut connection = connection.clone();
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(part.slot, SlotAddr::Master),
                ));
                let value = connection
                    .route_command(wait, route)
                    .await
                    .map_err(|e| classify(&e))?;
                redis::FromRedisValue::from_redis_value(value)
                    .map_err(|e| Error::Io(e.to_string()))?
            }
        };
        if acknowledged < self.replicas {
            return Err(Error::Unreachable(format!(
                "the write is on the primary but only {acknowledged} of {} replicas had it \
                 within {REPLICA_TIMEOUT:?}",
                self.replicas
            )));
        }
        Ok(())
    }

    pub(crate) async fn schedule(&self, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        // A delay goes to the server as a delay: its clock, not ours, resolves it.
        let (mode, ms) = match task.due {
            None => ("after", 0),
            Some(Due::After(delay)) => ("after", super::delay_ms(delay)),
            Some(Due::At(at)) => ("at", super::epoch_ms(at)),
        };
        let keys = self.keys_for(id.as_str());
        let call = call_id();
        let answer: String = self
            .invoke_write(
                keys,
                &self.scripts.schedule,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.dead,
                    &keys.seq,
                    &keys.idle,
                    &keys.mark(id.as_str()),
                    &keys.inflight,
                ],
                redis_args![
                    "tw-schedule",
                    id.as_str(),
                    task.payload.as_slice(),
                    mode,
                    ms,
                    &keys.channel,
                    &call
                ],
            )
            .await?;
        match answer.as_str() {
            "INFLIGHT" => Err(Error::InFlight),
            _ => Ok(id),
        }
    }

    pub(crate) async fn change(&self, id: &str, op: &str, due: u64) -> Result<bool, Error> {
        let keys = self.keys_for(id);
        let changed: i64 = self
            .invoke_write(
                keys,
                &self.scripts.change,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.dead,
                    &keys.idle,
                    &keys.inflight,
                ],
                redis_args!["tw-change", id, op, due, &keys.channel],
            )
            .await?;
        Ok(changed == 1)
    }

    /// Finishes the delivery `token` of task `id` (its `attempt`-th).
    pub(crate) async fn finish(
        &self,
        id: &str,
        token: u64,
        attempt: u32,
        outcome: Outcome,
    ) -> Result<(), Error> {
        let (outcome, delay, reason) = match outcome {
            Outcome::Ack => ("ack", 0, String::new()),
            Outcome::Retry(after) => {
                let delay = after.unwrap_or_else(|| self.settings.policy.jittered_delay(attempt));
                ("retry", super::delay_ms(delay), String::new())
            }
            Outcome::Fail(reason) => ("dead", 0, reason),
        };
        let keys = self.keys_for(id);
        let window = super::delay_ms(self.settings.lease.max(MIN_MARK_WINDOW));
        // Its retries (same arguments) are recognised, another finish of the same delivery
        // is not.
        let call = call_id();
        let done: i64 = self
            .invoke_write(
                keys,
                &self.scripts.finish,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.inflight,
                    &keys.due,
                    &keys.dead,
                    &keys.mark(id),
                    &keys.idle,
                    &keys.stats,
                ],
                redis_args![
                    "tw-finish",
                    id,
                    token,
                    outcome,
                    delay,
                    reason,
                    &keys.channel,
                    self.settings.policy.attempts(),
                    window,
                    &call
                ],
            )
            .await?;
        if done == 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// Groups deliveries by partition, in pages of at most [`PAGE`].
    fn by_partition<'d>(
        &self,
        deliveries: &'d [(String, u64)],
    ) -> Vec<(usize, Vec<&'d (String, u64)>)> {
        let mut groups: Vec<Vec<&(String, u64)>> = vec![Vec::new(); self.parts.len()];
        for delivery in deliveries {
            groups[partition_of(&delivery.0, self.parts.len())].push(delivery);
        }
        groups
            .into_iter()
            .enumerate()
            .flat_map(|(p, group)| {
                group
                    .chunks(PAGE)
                    .map(|page| (p, page.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Sets the leases of these deliveries to end `lease` from now (server time), in pages —
    /// only later than now unless `set` (a user's `extend`); returns how many were still held.
    pub(crate) async fn extend(
        &self,
        deliveries: &[(String, u64)],
        lease: Duration,
        set: bool,
    ) -> Result<usize, Error> {
        let mut held = 0;
        let mode = if set { "set" } else { "renew" };
        for (p, page) in self.by_partition(deliveries) {
            let keys = &self.parts[p];
            let mut args = redis_args!["tw-extend", super::delay_ms(lease), mode];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let flags: Vec<i64> = self
                .invoke(&self.scripts.extend, &[&keys.meta, &keys.inflight], args)
                .await?;
            held += flags.iter().filter(|&&f| f == 1).count();
        }
        Ok(held)
    }

    /// Returns claims never handed out, in pages.
    async fn release(&self, deliveries: &[(String, u64)]) -> Result<(), Error> {
        for (p, page) in self.by_partition(deliveries) {
            let keys = &self.parts[p];
            let mut args = redis_args!["tw-release", &keys.channel];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let _: i64 = self
                .invoke_write(
                    keys,
                    &self.scripts.release,
                    &[
                        &keys.meta,
                        &keys.inflight,
                        &keys.due,
                        &keys.idle,
                        &keys.stats,
                    ],
                    args,
                )
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn len(&self) -> Result<usize, Error> {
        let mut total = 0;
        for keys in &self.parts {
            let (due, inflight): (usize, usize) = with_retries(|| {
                let mut connection = self.connection.clone();
                let mut pipe = redis::pipe();
                pipe.zcard(&keys.due).zcard(&keys.inflight);
                async move { pipe.query_async(&mut connection).await }
            })
            .await?;
            total += due + inflight;
        }
        Ok(total)
    }

    /// Every dead letter, a page of [`PAGE`] at a time so no command grows with the list.
    pub(crate) async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.dead_letters_page(after.as_deref(), PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.to_string());
            letters.extend(page);
        }
        Ok(letters)
    }

    /// Advances the claimed recurring schedule `id` (held by `token`): makes the `owed`
    /// occurrences and moves it to `next_due`.
    async fn advance(
        &self,
        id: &str,
        token: u64,
        spec: &Spec,
        next_due: u64,
        owed: &[u64],
    ) -> Result<(), Error> {
        let keys = self.keys_for(id);
        let mut args = redis_args![
            "tw-advance",
            id,
            token,
            spec.encode(),
            next_due,
            &keys.channel
        ];
        for at in owed {
            args.extend(redis::ToRedisArgs::to_redis_args(at));
        }
        let _: i64 = self
            .invoke_write(
                keys,
                &self.scripts.advance,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.seq,
                    &keys.idle,
                ],
                args,
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn schedule_recurring(&self, recurring: Recurring) -> Result<TaskId, Error> {
        // Validated here; the server's clock sets its start.
        let (id, spec, payload) = recurring.into_parts(0)?;
        let (catch_up, kind, definition) = spec.definition();
        let keys = self.keys_for(id.as_str());
        let answer: String = self
            .invoke_write(
                keys,
                &self.scripts.schedule_recurring,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.seq,
                    &keys.idle,
                ],
                redis_args![
                    "tw-recurring",
                    id.as_str(),
                    payload.as_slice(),
                    catch_up,
                    kind,
                    definition,
                    &keys.channel
                ],
            )
            .await?;
        match answer.as_str() {
            "INFLIGHT" => Err(Error::InFlight),
            _ => Ok(id),
        }
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<TaskInfo>, Error> {
        let keys = self.keys_for(id);
        let reply: Vec<Vec<u8>> = self
            .invoke(
                &self.scripts.get,
                &[&keys.meta, &keys.inflight, &keys.payload],
                redis_args!["tw-get", id],
            )
            .await?;
        let mut fields = reply.into_iter();
        let (Some(meta), Some(lease), Some(len)) = (fields.next(), fields.next(), fields.next())
        else {
            return Ok(None);
        };
        let meta = String::from_utf8(meta).map_err(|_| Error::Io("a record is not text".into()))?;
        task_info(id, &meta, number(&lease), number(&len).unwrap_or(0)).map(Some)
    }

    /// One page of one partition's index, with payload lengths (or payloads).
    async fn page_of(
        &self,
        p: usize,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
        payloads: bool,
    ) -> Result<Vec<(String, String, Option<u64>, Vec<u8>)>, Error> {
        let keys = &self.parts[p];
        let name = match filter {
            TaskFilter::Pending => "pending",
            TaskFilter::InFlight => "inflight",
            TaskFilter::Dead => "dead",
        };
        let reply: redis::Value = self
            .invoke(
                &self.scripts.list,
                &[
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.payload,
                ],
                redis_args![
                    "tw-list",
                    name,
                    after.unwrap_or(""),
                    limit,
                    if payloads { "1" } else { "0" }
                ],
            )
            .await?;
        let bad = || Error::Io("unexpected reply from the list script".into());
        let items: Vec<Vec<u8>> = match reply {
            redis::Value::SimpleString(text) if text == "STALE" => {
                return Err(stale_cursor(after.unwrap_or(""), filter));
            }
            redis::Value::BulkString(text) if text == b"STALE" => {
                return Err(stale_cursor(after.unwrap_or(""), filter));
            }
            other => redis::FromRedisValue::from_redis_value(other).map_err(|_| bad())?,
        };
        let mut page = Vec::new();
        let mut fields = items.into_iter();
        while let (Some(id), Some(meta), Some(lease), Some(last)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        {
            let text = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| bad());
            page.push((text(id)?, text(meta)?, number(&lease), last));
        }
        Ok(page)
    }

    /// A page across partitions: one partition after another (in order within each), the
    /// cursor naming where to go on.
    async fn page(
        &self,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
        payloads: bool,
    ) -> Result<Vec<(String, String, Option<u64>, Vec<u8>)>, Error> {
        let mut p = after.map_or(0, |id| partition_of(id, self.parts.len()));
        let mut cursor = after;
        let mut page = Vec::new();
        while p < self.parts.len() && page.len() < limit {
            page.extend(
                self.page_of(p, filter, cursor, limit - page.len(), payloads)
                    .await?,
            );
            cursor = None;
            p += 1;
        }
        Ok(page)
    }

    pub(crate) async fn list(
        &self,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.page(filter, after, limit, false)
            .await?
            .into_iter()
            .map(|(id, meta, lease, len)| task_info(&id, &meta, lease, number(&len).unwrap_or(0)))
            .collect()
    }

    pub(crate) async fn dead_letters_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.page(TaskFilter::Dead, after, limit, true)
            .await?
            .into_iter()
            .map(|(id, meta, lease, payload)| {
                let info = task_info(&id, &meta, lease, payload.len() as u64)?;
                Ok(DeadLetter {
                    id: info.id,
                    payload,
                    attempts: info.attempts,
                    reason: info.reason.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Purges dead letters older than `older_than_ms`, a bounded batch per script call.
    pub(crate) async fn purge_dead(&self, older_than_ms: u64) -> Result<u64, Error> {
        let mut removed = 0;
        for keys in &self.parts {
            loop {
                let batch: u64 = self
                    .invoke_write(
                        keys,
                        &self.scripts.purge,
                        &[&keys.meta, &keys.dead, &keys.payload],
                        redis_args!["tw-purge", older_than_ms, PAGE],
                    )
                    .await?;
                removed += batch;
                if batch < PAGE as u64 {
                    break;
                }
            }
        }
        Ok(removed)
    }

    /// The counts and counters, summed over the partitions (each read atomically).
    pub(crate) async fn stats(&self) -> Result<QueueStats, Error> {
        let mut stats = QueueStats::default();
        let mut late = Vec::new();
        for keys in &self.parts {
            let reply: Vec<u64> = self
                .invoke(
                    &self.scripts.stats,
                    &keys.stats_keys(),
                    redis_args!["tw-stats"],
                )
                .await?;
            let field = |i: usize| reply.get(i).copied().unwrap_or(0);
            stats.pending += field(0);
            stats.in_flight += field(1);
            stats.dead += field(2);
            stats.delivered += field(3);
            stats.acked += field(4);
            stats.retried += field(5);
            stats.dead_lettered += field(6);
            stats.expired += field(7);
            stats.returned += field(8);
            late.extend(reply.iter().skip(9).copied());
        }
        stats.lateness_p50 = percentile(&mut late, 50);
        stats.lateness_p99 = percentile(&mut late, 99);
        Ok(stats)
    }
}

/// A task as its metadata record (`state|due|seq|attempts|token|call|reason`) says.
fn task_info(
    id: &str,
    meta: &str,
    lease: Option<u64>,
    payload_len: u64,
) -> Result<TaskInfo, Error> {
    let bad = || Error::Corrupt(format!("task {id:?} has a damaged record"));
    let mut fields = meta.splitn(7, '|');
    let state = fields.next().ok_or_else(bad)?;
    let due: u64 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let attempts: u32 = fields.nth(1).and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let reason = fields.nth(2).unwrap_or_default().to_owned();
    let (state, reason) = match state {
        "i" => (
            TaskState::InFlight {
                attempt: attempts,
                lease_until: system_time(lease.unwrap_or(0)),
            },
            None,
        ),
        "d" => (
            TaskState::Dead {
                reason: reason.clone(),
            },
            Some(reason),
        ),
        // Pending, or a recurring schedule (`r`; `R` while a worker advances it).
        _ => (TaskState::Pending, None),
    };
    Ok(TaskInfo {
        id: TaskId::from(id),
        state,
        due: system_time(due),
        attempts,
        payload_len: usize::try_from(payload_len).unwrap_or(usize::MAX),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"foo"), 12_182);
        assert_eq!(slot_of(b"bar"), 5_061);
        assert_eq!(slot_of(b"123456789"), 12_739);
    }

    #[test]
    fn partitions_spread_over_the_slot_space() {
        assert_eq!(partition_tags("q", 1), ["q"]);
        for n in [2, 3, 8, 16] {
            let tags = partition_tags("orders", n);
            for (p, tag) in tags.iter().enumerate() {
                let slot = usize::from(slot_of(tag.as_bytes()));
                assert!(
                    (p * 16_384 / n..(p + 1) * 16_384 / n).contains(&slot),
                    "{tag}"
                );
            }
        }
        let counts = (0..10_000).fold([0; 4], |mut counts, i| {
            counts[partition_of(&format!("task-{i}"), 4)] += 1;
            counts
        });
        assert!(counts.iter().all(|&c| c > 2_000), "{counts:?}");
    }
}
