-- get.lua — one task as it is now.
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[3] payload    hash: id → payload
--
-- ARGV[1] label      'tw-get' (not read)
-- ARGV[2] id
--
-- Reply: the record, the lease end ('' if not in flight) and the payload length; or nothing
-- (an empty array) if there is no such task.
--
-- Invariants: reads only; the three from one atomic step.

local m = redis.call('HGET', KEYS[1], ARGV[2])
if not m then return {} end
return {m, redis.call('ZSCORE', KEYS[2], ARGV[2]) or '',
  fmt(redis.call('HSTRLEN', KEYS[3], ARGV[2]))}
