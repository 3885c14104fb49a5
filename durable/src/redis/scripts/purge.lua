-- purge.lua — deletes old dead letters, a bounded batch per call.
--
-- KEYS[1] meta       hash: id → record
-- KEYS[2] dead       sorted set: dead ids, score = time of death (ms)
-- KEYS[3] payload    hash: id → payload
--
-- ARGV[1] label      'tw-purge' (not read)
-- ARGV[2] older-than ms: deletes those that died more than this long ago (server clock);
--                    0: all of them
-- ARGV[3] batch      most letters deleted by this call
--
-- Reply: how many were deleted (the caller calls again while it is `batch`).
--
-- Invariants: never touches more than `batch` dead letters.

local upto = '+inf'
if tonumber(ARGV[2]) > 0 then upto = '(' .. fmt(now_ms() - tonumber(ARGV[2])) end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', upto, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
end
return #ids
