-- schedule.lua — makes (or replaces) a batch of tasks, each pending at its due time: one
-- `schedule` call, concurrent calls gathered into one invocation, or a `schedule_many` chunk.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] due        sorted set: pending tasks, score = due (ms), member = member(seq, id)
-- KEYS[4] dead       sorted set: dead ids, score = time of death
-- KEYS[5] seq        counter: schedule order
-- KEYS[6] idle       sorted set: workers with room that found nothing due (to wake one)
-- KEYS[7] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[8..] mark     per task, in order: string `tw:{q}:done:<id>`, `token|call|schedule-call`
--                    of the task's last finish (expires after a lease, at least 1 s)
--
-- ARGV[1] label      'tw-schedule' (not read)
-- ARGV[2] channel    the partition's wake channel
-- ARGV[3..] tasks    five per task, in order: id, payload, mode ('at': ms is a time, ms since
--                    the epoch; 'after': a delay, added to the server's clock, so the caller's
--                    clock never decides), ms, call (that task's call id, the same on every
--                    retry of it)
--
-- Reply: per task, in order: 'OK' (scheduled, or already scheduled by this call), or
-- 'INFLIGHT' (a delivery of that id is in flight: that task changed nothing).
--
-- Invariants: tasks are taken in order, each exactly as a batch of one would take it (a later
-- task of the same id replaces an earlier one; ties in due time go in this order). One
-- record per id — a pending, dead or recurring task of the same id is removed from its index
-- before it is replaced, an in-flight one is never replaced. A call retried after a lost
-- reply is recognised (by the task's record, or by the mark its ack left) and answers 'OK'
-- without acting again: a retry never makes an acked task again. The caller sends at most a
-- bounded batch (see batch.rs).

local now = now_ms()
local out = {}
local n = (#ARGV - 2) / 5
for i = 0, n - 1 do
  local a = 3 + i * 5
  local id, payload, mode, ms, call = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local due = tonumber(ms)
  if mode == 'after' then due = now + due end
  local answer = nil
  local m = redis.call('HGET', KEYS[2], id)
  if m then
    local st, d, seq, att, tok, reason, c = parse(m)
    if c == call then
      answer = 'OK' -- this call, retried after a lost reply
    elseif st == 'i' then
      answer = 'INFLIGHT'
    else
      if st == 'p' or st == 'r' then redis.call('ZREM', KEYS[3], member(seq, id)) end
      if st == 'd' then redis.call('ZREM', KEYS[4], id) end
      if st == 'R' then redis.call('ZREM', KEYS[7], id) end
    end
  else
    local mark = redis.call('GET', KEYS[8 + i])
    if mark and string.match(mark, '|([^|]*)$') == call then answer = 'OK' end
  end
  if answer == nil then
    local seq = redis.call('INCR', KEYS[5])
    redis.call('HSET', KEYS[1], id, payload)
    redis.call('HSET', KEYS[2], id, record('p', due, seq, 0, '0', '', call))
    announce(KEYS[3], ARGV[2], KEYS[6], due, now)
    redis.call('ZADD', KEYS[3], due, member(seq, id))
    answer = 'OK'
  end
  table.insert(out, answer)
end
return out
