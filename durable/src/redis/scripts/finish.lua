-- finish.lua — ends one delivery: ack (delete), retry (pending again after a delay), or
-- dead (to the dead letters with a reason).
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[4] due        sorted set: pending tasks, score = due (ms)
-- KEYS[5] dead       sorted set: dead ids, score = time of death
-- KEYS[6] mark       string `tw:{q}:done:<id>`, written here: `token|call|schedule-call`
-- KEYS[7] idle       sorted set: idle workers (to wake one)
-- KEYS[8] stats      hash: the queue's counters
--
-- ARGV[1] label      'tw-finish' (not read)
-- ARGV[2] id
-- ARGV[3] token      the delivery being finished
-- ARGV[4] outcome    'ack', 'retry' or 'dead'
-- ARGV[5] delay      ms before a retry is due
-- ARGV[6] reason     why it died ('dead')
-- ARGV[7] channel    the partition's wake channel
-- ARGV[8] attempts   most deliveries of a task: a retry of the last one goes to the dead letters
-- ARGV[9] window     ms the mark lives (a lease, at least 1 s)
-- ARGV[10] call      this call's id, the same on every retry of it
--
-- Reply: 1 if this call took effect (now, or before, when its reply was lost: the mark names
-- the delivery and the call), 0 if the lease was lost — including a second, different finish
-- of the same delivery.
--
-- Invariants: only the holder of the current delivery (its token) changes the task, and only
-- once. The mark also names the schedule call that made the task, so that call, retried
-- after the task was acked, does not make it again.

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
