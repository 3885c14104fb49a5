-- extend.lua — sets leases still held to end `lease` from now (server clock).
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] inflight   sorted set: in-flight ids, score = lease end
--
-- ARGV[1] label      'tw-extend' (not read)
-- ARGV[2] lease      ms from now
-- ARGV[3] mode       'set' (a user's extend: may shorten) or 'renew' (the engine's renewals
--                    and hand-outs: never shortens, so it cannot undo a user's longer extend)
-- ARGV[4..] pairs    id, token, id, token, …
--
-- Reply: 1 or 0 per pair, in order: whether that delivery was still held.
--
-- Invariants: touches only a lease held by that token; as many entries as pairs given (the
-- caller sends at most a page).

local lease_end = now_ms() + tonumber(ARGV[2])
local out = {}
for i = 4, #ARGV, 2 do
  local ok = 0
  local m = redis.call('HGET', KEYS[1], ARGV[i])
  if m then
    local st, d, seq, att, t = parse(m)
    if st == 'i' and t == ARGV[i + 1] then
      if ARGV[3] == 'set' then
        redis.call('ZADD', KEYS[2], lease_end, ARGV[i])
      else
        redis.call('ZADD', KEYS[2], 'GT', lease_end, ARGV[i])
      end
      ok = 1
    end
  end
  table.insert(out, ok)
end
return out
