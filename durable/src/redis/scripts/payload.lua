-- payload.lua — one task's payload, for an operator's look at it.
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] payload    hash: id → payload
--
-- ARGV[1] label      'tw-payload' (not read)
-- ARGV[2] id
--
-- Reply: a one-element array with the payload ('' if it has none), or an empty array if
-- there is no such task.
--
-- Invariants: reads only; the record and the payload from one atomic step (a payload
-- without a record — never left by the queue's scripts — is not reported).

local m = redis.call('HGET', KEYS[1], ARGV[2])
if not m then return {} end
return {redis.call('HGET', KEYS[2], ARGV[2]) or ''}
