//! The durable queue shared across processes through Redis (feature `redis`).
//!
//! # Data layout
//!
//! Every key of a queue named `orders` carries the hash tag `{orders}`, so the whole queue
//! lives in one Redis Cluster slot and every script is atomic:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `tw:{orders}:payload` | hash | id → payload |
//! | `tw:{orders}:meta` | hash | id → `state|due|seq|attempts|token|call|reason` (`call` names the schedule call that made it, so that call retried after a lost reply is recognised) |
//! | `tw:{orders}:due` | sorted set | pending tasks, score = due (ms), member = zero-padded seq + id, so ties go in schedule order |
//! | `tw:{orders}:inflight` | sorted set | in-flight ids, score = lease end (ms) |
//! | `tw:{orders}:dead` | sorted set | dead ids, score = seq |
//! | `tw:{orders}:seq`, `tw:{orders}:token` | counters | schedule order, delivery tokens |
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
use redis::{AsyncCommands, Script};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::engine::{
    Consumer, Reply, Request, Settings, attach, far_future, now_ms, shut_down, stale_cursor,
    system_time,
};
use super::inspect::{QueueStats, TaskFilter, TaskInfo, TaskState, percentile};
use super::recurring::Spec;
use super::{DeadLetter, Delivery, Due, Error, Outcome, Recurring, Route, Task, TaskId};
use crate::Wheel;

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
-- Wakes one idle worker (one with room for more that found nothing to claim) to claim now.
-- A worker that is gone has no subscriber on its channel: try the next.
local function wake_one(idle)
  for _ = 1, 8 do
    local worker = redis.call('ZPOPMIN', idle)
    if #worker == 0 then return end
    if redis.call('PUBLISH', worker[1], 'claim') > 0 then return end
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

/// Script arguments, each turned into Redis bytes once (so retries resend the same values).
macro_rules! redis_args {
    ($($value:expr),* $(,)?) => {{
        let mut args: Vec<Vec<u8>> = Vec::new();
        $(args.extend(redis::ToRedisArgs::to_redis_args(&$value));)*
        args
    }};
}

/// The keys of one queue.
struct Keys {
    prefix: String,
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
    /// The queue's counters (a hash).
    stats: String,
    /// The lateness of the latest claims (a capped list).
    lateness: String,
}

impl Keys {
    fn new(name: &str) -> Keys {
        let prefix = format!("tw:{{{name}}}:");
        let key = |part: &str| format!("{prefix}{part}");
        Keys {
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

    /// Where the outcome of the delivery with this token is remembered for a while.
    /// Where the last finish of task `id` is remembered for a while (which delivery, which
    /// call, and which schedule call made the task).
    fn mark(&self, id: &str) -> String {
        format!("{}done:{id}", self.prefix)
    }

    /// The channel that wakes one worker alone.
    fn worker_channel(&self, claimer: &str) -> String {
        format!("{}wake:{claimer}", self.prefix)
    }

    /// The channels a worker listens on: every worker's, and its own.
    fn channels(&self, claimer: &str) -> (String, String) {
        (self.channel.clone(), self.worker_channel(claimer))
    }

    /// Where one claim call records what it handed out.
    fn claim_record(&self, claimer: &str, call: u64) -> String {
        format!("{}claim:{claimer}:{call}", self.prefix)
    }
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
}

/// One queue's connection, keys, scripts and settings: what the engine and every handle and
/// delivery of the queue call directly.
pub(crate) struct Shared {
    keys: Keys,
    scripts: Scripts,
    connection: ConnectionManager,
    settings: Settings,
}

/// Whether trying again may succeed: a lost or refused connection, a timeout, a server still
/// loading its data after a restart. Anything else (a script error, bad data) is final.
fn is_transient(error: &redis::RedisError) -> bool {
    !matches!(error.retry_method(), redis::RetryMethod::NoRetry)
}

/// Runs a Redis operation, retrying with backoff while the server is unreachable.
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
            Err(error) if !is_transient(&error) => return Err(Error::Io(error.to_string())),
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

/// Connects (failing with [`Error::Unreachable`] if it cannot) and starts the engine.
pub(crate) async fn start(
    url: &str,
    name: &str,
    settings: Settings,
    wheel: &Wheel,
) -> Result<(mpsc::UnboundedSender<Request>, Arc<Shared>), Error> {
    let client = redis::Client::open(url).map_err(|e| Error::Unreachable(e.to_string()))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(2)
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_max_delay(Duration::from_secs(2));
    let mut connection = ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))?;
    let _: () = redis::cmd("PING")
        .query_async(&mut connection)
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))?;
    let shared = Arc::new(Shared {
        keys: Keys::new(name),
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
        },
        connection,
        settings,
    });
    let (requests, receiver) = mpsc::unbounded_channel();
    let (wake_sender, wakes) = mpsc::unbounded_channel();
    let attachment = attach(wheel);
    let claimer = TaskId::generate().0;
    let listener =
        attachment
            .runtime
            .spawn(listen(client, shared.keys.channels(&claimer), wake_sender));
    let engine = RedisEngine {
        shared: shared.clone(),
        requests: receiver,
        handle: requests.downgrade(),
        consumers: Vec::new(),
        wheel: wheel.clone(),
        shutdown: attachment.shutdown,
        wakes,
        own_channel: shared.keys.worker_channel(&claimer),
        claimer,
        claims: 0,
        offset_ms: 0,
        next_due: None,
        next_lease: None,
        more: false,
        refresh: true,
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

/// What the wake channels tell the engine.
enum Wake {
    /// This worker was picked to claim a task that is due (on its own channel).
    Claim,
    /// A task became pending at this server time, earlier than any other.
    Due(u64),
    /// (Re)subscribed: anything may have happened while away.
    Refresh,
}

/// Subscribes to the queue's wake channel, resubscribing after connection loss, and passes
/// every message to the engine.
async fn listen(
    client: redis::Client,
    (shared, own): (String, String),
    wake: mpsc::UnboundedSender<Wake>,
) {
    let mut delay = Duration::from_millis(50);
    loop {
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            if pubsub.subscribe(&[&shared, &own]).await.is_ok() {
                delay = Duration::from_millis(50);
                if wake.send(Wake::Refresh).is_err() {
                    return;
                }
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let event = if message.get_channel_name() == own {
                        Wake::Claim
                    } else {
                        Wake::Due(message.get_payload::<u64>().unwrap_or(0))
                    };
                    if wake.send(event).is_err() {
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

struct RedisEngine {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    handle: mpsc::WeakUnboundedSender<Request>,
    consumers: Vec<Consumer>,
    wheel: Wheel,
    shutdown: tokio::sync::watch::Receiver<bool>,
    wakes: mpsc::UnboundedReceiver<Wake>,
    /// Names this engine's claim records; `claims` counts its claim calls.
    claimer: String,
    /// Where the server wakes this worker alone.
    own_channel: String,
    claims: u64,
    /// Server clock minus this process's wall clock (ms), from the last claim: used only to
    /// arm the wheel, never to decide what is due.
    offset_ms: i64,
    /// Server times: the earliest pending task and lease end known.
    next_due: Option<u64>,
    next_lease: Option<u64>,
    /// Expired leases remain beyond the last claim's batch.
    more: bool,
    /// Learn the heads again (at start, after a resubscribe, after an error).
    refresh: bool,
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
        loop {
            if *self.shutdown.borrow_and_update() || self.close_done() {
                break;
            }
            if self.should_claim() {
                match self.claim().await {
                    Ok(()) => self.retry_at = None,
                    Err(error) => {
                        tracing::warn!(%error, "claiming from redis failed; retrying");
                        self.refresh = true;
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
                () = shut_down(&mut self.shutdown) => break,
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

    /// The server's clock as this process estimates it.
    fn server_now(&self) -> u64 {
        now_ms().saturating_add_signed(self.offset_ms)
    }

    /// The instant on Tokio's clock when the server's clock reads `ms`.
    fn instant_of(&self, ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms.saturating_sub(self.server_now()))
    }

    fn wanted(&self) -> usize {
        self.consumers
            .iter()
            .filter(|c| c.wants())
            .map(|c| c.credits.load(Ordering::Acquire))
            .sum()
    }

    fn should_claim(&self) -> bool {
        if self.retry_at.is_some_and(|at| at > Instant::now()) {
            return false;
        }
        let now = self.server_now();
        let closing = self.close_deadline.is_some();
        let wanted = !closing && self.wanted() > 0;
        self.refresh
            || self.more
            || self.retry_at.is_some()
            || (wanted && (self.demand || self.next_due.is_some_and(|due| due <= now)))
            || self.next_lease.is_some_and(|end| end <= now)
    }

    fn next_wake(&self) -> Option<Instant> {
        if self.more || self.refresh {
            return Some(Instant::now());
        }
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        let wanted = self.close_deadline.is_none() && self.wanted() > 0;
        let due = self.next_due.filter(|_| wanted);
        let server = match (due, self.next_lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        [
            server.map(|ms| self.instant_of(ms)),
            self.renew_at,
            self.purge_at,
            self.close_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn woken(&mut self, wake: Wake) {
        match wake {
            Wake::Due(due) => {
                self.next_due = Some(self.next_due.map_or(due, |known| known.min(due)));
            }
            Wake::Refresh | Wake::Claim => self.refresh = true,
        }
    }

    /// Claims up to what the streams want, hands the tasks out, and learns when to look again.
    async fn claim(&mut self) -> Result<(), Error> {
        let shared = self.shared.clone();
        let keys = &shared.keys;
        let settings = &shared.settings;
        let wanted = if self.close_deadline.is_some() {
            0
        } else {
            self.wanted().min(CLAIM_BATCH)
        };
        let previous = self.claim_key(self.claims);
        self.claims += 1;
        let record = self.claim_key(self.claims);
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
        self.offset_ms = claim.server_now as i64 - midpoint as i64;
        self.next_due = claim.next_due;
        self.next_lease = claim.next_lease;
        self.more = claim.more;
        self.refresh = false;
        self.demand = false;
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
            self.refresh = true;
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

    fn claim_key(&self, call: u64) -> String {
        self.shared.keys.claim_record(&self.claimer, call)
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

fn parse_claim(reply: Vec<Vec<u8>>) -> Result<Claim, Error> {
    let bad = || Error::Io("unexpected reply from the claim script".into());
    let number = |bytes: &[u8]| -> Option<u64> {
        let text = std::str::from_utf8(bytes).ok()?;
        // Redis prints scores as doubles ("1.7e+12" for some): read them as such.
        text.parse::<u64>()
            .ok()
            .or_else(|| text.parse::<f64>().ok().map(|f| f as u64))
    };
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

    pub(crate) async fn schedule(&self, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        // A delay goes to the server as a delay: its clock, not ours, resolves it.
        let (mode, ms) = match task.due {
            None => ("after", 0),
            Some(Due::After(delay)) => ("after", super::delay_ms(delay)),
            Some(Due::At(at)) => ("at", super::epoch_ms(at)),
        };
        let keys = &self.keys;
        let call = call_id();
        let answer: String = self
            .invoke(
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
        let keys = &self.keys;
        let changed: i64 = self
            .invoke(
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
        let keys = &self.keys;
        let window = super::delay_ms(self.settings.lease.max(MIN_MARK_WINDOW));
        // Its retries (same arguments) are recognised, another finish of the same delivery
        // is not.
        let call = call_id();
        let done: i64 = self
            .invoke(
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
        for page in deliveries.chunks(PAGE) {
            let mut args = redis_args!["tw-extend", super::delay_ms(lease), mode];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let flags: Vec<i64> = self
                .invoke(
                    &self.scripts.extend,
                    &[&self.keys.meta, &self.keys.inflight],
                    args,
                )
                .await?;
            held += flags.iter().filter(|&&f| f == 1).count();
        }
        Ok(held)
    }

    /// Returns claims never handed out, in pages.
    async fn release(&self, deliveries: &[(String, u64)]) -> Result<(), Error> {
        for page in deliveries.chunks(PAGE) {
            let mut args = redis_args!["tw-release", &self.keys.channel];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let _: i64 = self
                .invoke(
                    &self.scripts.release,
                    &[
                        &self.keys.meta,
                        &self.keys.inflight,
                        &self.keys.due,
                        &self.keys.idle,
                        &self.keys.stats,
                    ],
                    args,
                )
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn len(&self) -> Result<usize, Error> {
        let (due, inflight): (usize, usize) = with_retries(|| {
            let mut connection = self.connection.clone();
            let mut pipe = redis::pipe();
            pipe.zcard(&self.keys.due).zcard(&self.keys.inflight);
            async move { pipe.query_async(&mut connection).await }
        })
        .await?;
        Ok(due + inflight)
    }

    /// The dead letters, read a page of [`PAGE`] at a time so no command grows with the list.
    pub(crate) async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        let mut start = 0;
        loop {
            let ids: Vec<String> = with_retries(|| {
                let mut connection = self.connection.clone();
                let key = self.keys.dead.clone();
                async move {
                    connection
                        .zrange(key, start as isize, (start + PAGE - 1) as isize)
                        .await
                }
            })
            .await?;
            if ids.is_empty() {
                break;
            }
            let (metas, payloads): (Vec<Option<String>>, Vec<Option<Vec<u8>>>) =
                with_retries(|| {
                    let mut connection = self.connection.clone();
                    let mut pipe = redis::pipe();
                    pipe.cmd("HMGET").arg(&self.keys.meta).arg(&ids);
                    pipe.cmd("HMGET").arg(&self.keys.payload).arg(&ids);
                    async move { pipe.query_async(&mut connection).await }
                })
                .await?;
            let page = ids.len();
            letters.extend(
                ids.into_iter()
                    .zip(metas.into_iter().zip(payloads))
                    .filter_map(|(id, (meta, payload))| {
                        let meta = meta?;
                        // state|due|seq|attempts|token|call|reason
                        let mut fields = meta.splitn(7, '|');
                        let attempts = fields.nth(3)?.parse().ok()?;
                        let reason = fields.nth(2).unwrap_or_default().to_owned();
                        Some(DeadLetter {
                            id: TaskId::from(id),
                            payload: payload?,
                            attempts,
                            reason,
                        })
                    }),
            );
            if page < PAGE {
                break;
            }
            start += PAGE;
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
        let keys = &self.keys;
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
            .invoke(
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
        let keys = &self.keys;
        let answer: String = self
            .invoke(
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
        let (meta, lease, payload_len): (Option<String>, Option<f64>, usize) = with_retries(|| {
            let mut connection = self.connection.clone();
            let mut pipe = redis::pipe();
            pipe.atomic()
                .hget(&self.keys.meta, id)
                .zscore(&self.keys.inflight, id)
                .cmd("HSTRLEN")
                .arg(&self.keys.payload)
                .arg(id);
            async move { pipe.query_async(&mut connection).await }
        })
        .await?;
        meta.map(|meta| task_info(id, &meta, lease.map(|l| l as u64), payload_len as u64))
            .transpose()
    }

    /// One page of an index, with payload lengths (or payloads).
    async fn page(
        &self,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
        payloads: bool,
    ) -> Result<Vec<(String, String, Option<u64>, Vec<u8>)>, Error> {
        let keys = &self.keys;
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
            let lease = std::str::from_utf8(&lease)
                .ok()
                .and_then(|l| l.parse::<f64>().ok())
                .map(|l| l as u64);
            page.push((text(id)?, text(meta)?, lease, last));
        }
        Ok(page)
    }

    pub(crate) async fn list(
        &self,
        filter: TaskFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, Error> {
        self.page(filter, after, limit, false)
            .await?
            .into_iter()
            .map(|(id, meta, lease, len)| {
                let len = std::str::from_utf8(&len)
                    .ok()
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(0);
                task_info(&id, &meta, lease, len)
            })
            .collect()
    }

    pub(crate) async fn dead_letters_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
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
        loop {
            let batch: u64 = self
                .invoke(
                    &self.scripts.purge,
                    &[&self.keys.meta, &self.keys.dead, &self.keys.payload],
                    redis_args!["tw-purge", older_than_ms, PAGE],
                )
                .await?;
            removed += batch;
            if batch < PAGE as u64 {
                return Ok(removed);
            }
        }
    }

    pub(crate) async fn stats(&self) -> Result<QueueStats, Error> {
        type Snapshot = (u64, u64, u64, HashMap<String, u64>, Vec<u64>);
        let (pending, in_flight, dead, counters, mut late): Snapshot = with_retries(|| {
            let mut connection = self.connection.clone();
            let keys = &self.keys;
            let mut pipe = redis::pipe();
            pipe.atomic()
                .zcard(&keys.due)
                .zcard(&keys.inflight)
                .zcard(&keys.dead)
                .hgetall(&keys.stats)
                .lrange(&keys.lateness, 0, -1);
            async move { pipe.query_async(&mut connection).await }
        })
        .await?;
        let counter = |name: &str| counters.get(name).copied().unwrap_or(0);
        Ok(QueueStats {
            pending,
            in_flight,
            dead,
            delivered: counter("delivered"),
            acked: counter("acked"),
            retried: counter("retried"),
            dead_lettered: counter("dead_lettered"),
            expired: counter("expired"),
            returned: counter("returned"),
            lateness_p50: percentile(&mut late, 50),
            lateness_p99: percentile(&mut late, 99),
        })
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
