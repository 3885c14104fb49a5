-- advance.lua — the worker that claimed a recurring schedule makes the occurrences it owes
-- and moves the schedule to its next due time.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] due        sorted set: pending tasks and recurring schedules, score = due (ms)
-- KEYS[4] inflight   sorted set: in-flight ids (and claimed schedules), score = lease end
-- KEYS[5] seq        counter: schedule order
-- KEYS[6] idle       sorted set: idle workers (to wake one)
--
-- ARGV[1] label      'tw-advance' (not read)
-- ARGV[2] id         the schedule
-- ARGV[3] token      the claim that holds it
-- ARGV[4] spec       its new definition (the record's reason)
-- ARGV[5] next-due   ms since the epoch
-- ARGV[6] channel    the partition's wake channel
-- ARGV[7..] owed     the due times (ms) of the occurrences owed
--
-- Reply: 1, or 0 if the claim was lost (the schedule is not claimed by that token).
--
-- Invariants: only the holder of the claim advances it; an occurrence is a pending task
-- `id@ms` with the schedule's payload, made only if no task of that id exists (never twice).

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
