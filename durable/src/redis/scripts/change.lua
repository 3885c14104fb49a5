-- change.lua — one change to one task by a handle: cancel, reschedule, redrive or uncron.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] due        sorted set: pending tasks and recurring schedules, score = due (ms)
-- KEYS[4] dead       sorted set: dead ids, score = time of death
-- KEYS[5] idle       sorted set: idle workers (to wake one)
-- KEYS[6] inflight   sorted set: in-flight ids (and claimed schedules), score = lease end
--
-- ARGV[1] label      'tw-change' (not read)
-- ARGV[2] id
-- ARGV[3] op         'cancel' (delete a pending task), 'reschedule' (a pending task to
--                    ARGV[4]), 'redrive' (a dead task pending again now, attempts reset),
--                    'uncron' (delete a recurring schedule, claimed or not)
-- ARGV[4] due        ms since the epoch ('reschedule')
-- ARGV[5] channel    the partition's wake channel
--
-- Reply: 1 if the task was changed, 0 if there is no such task or it is not in the state the
-- op applies to.
--
-- Invariants: never touches an in-flight task; a rescheduled task keeps its place among tasks
-- due at the same ms (its seq).

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
