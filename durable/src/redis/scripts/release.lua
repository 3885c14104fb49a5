-- release.lua — returns claims never handed out (a prefetch buffer dropped or closed):
-- pending again at their due time, in their place, the delivery not counted.
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[3] due        sorted set: pending tasks, score = due (ms)
-- KEYS[4] idle       sorted set: idle workers (to wake one)
-- KEYS[5] stats      hash: the queue's counters (`returned`)
--
-- ARGV[1] label      'tw-release' (not read)
-- ARGV[2] channel    the partition's wake channel
-- ARGV[3..] pairs    id, token, id, token, …
--
-- Reply: how many were returned.
--
-- Invariants: returns only a claim still held by that token; its attempt count goes back by
-- one. As many entries as pairs given (the caller sends at most a page).

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
