-- schedule.lua — makes (or replaces) one task, pending at its due time.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] due        sorted set: pending tasks, score = due (ms), member = member(seq, id)
-- KEYS[4] dead       sorted set: dead ids, score = time of death
-- KEYS[5] seq        counter: schedule order
-- KEYS[6] idle       sorted set: workers with room that found nothing due (to wake one)
-- KEYS[7] mark       string `tw:{q}:done:<id>`: `token|call|schedule-call` of the task's last
--                    finish (expires after a lease, at least 1 s)
-- KEYS[8] inflight   sorted set: in-flight ids, score = lease end
--
-- ARGV[1] label      'tw-schedule' (not read)
-- ARGV[2] id
-- ARGV[3] payload
-- ARGV[4] mode       'at' (ARGV[5] is a time, ms since the epoch) or 'after' (a delay, added
--                    to the server's clock: the caller's clock never decides)
-- ARGV[5] ms
-- ARGV[6] channel    the partition's wake channel
-- ARGV[7] call       this call's id, the same on every retry of it
--
-- Reply: 'OK' (scheduled, or already scheduled by this call), or 'INFLIGHT' (a delivery of
-- that id is in flight: nothing changed).
--
-- Invariants: one record per id — a pending, dead or recurring task of the same id is
-- removed from its index before it is replaced, an in-flight one is never replaced. A call
-- retried after a lost reply is recognised (by the task's record, or by the mark its ack
-- left) and answers 'OK' without acting again: a retry never makes an acked task again.

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
