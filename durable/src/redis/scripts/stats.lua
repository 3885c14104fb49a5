-- stats.lua — one consistent snapshot of a partition's counts and counters.
--
-- KEYS[1] due        sorted set: pending tasks and recurring schedules
-- KEYS[2] inflight   sorted set: in-flight ids
-- KEYS[3] dead       sorted set: dead ids
-- KEYS[4] stats      hash: the counters
-- KEYS[5] lateness   list: lateness (ms) of the last 1000 deliveries
--
-- ARGV[1] label      'tw-stats' (not read)
--
-- Reply: the three counts (pending, in flight, dead), the six counters (delivered, acked,
-- retried, dead_lettered, expired, returned), then the lateness window.
--
-- Invariants: reads only; at most 1000 lateness entries.

local out = {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3])}
for _, name in ipairs({'delivered', 'acked', 'retried', 'dead_lettered', 'expired', 'returned'}) do
  table.insert(out, tonumber(redis.call('HGET', KEYS[4], name) or '0'))
end
for _, late in ipairs(redis.call('LRANGE', KEYS[5], -1000, -1)) do
  table.insert(out, tonumber(late))
end
return out
