-- floor: check each token, delete acked records, payloads and leases.
local n = (#ARGV - 4) / 5
local ids = {}
for i = 0, n - 1 do ids[i + 1] = ARGV[5 + i * 5] end
local metas = redis.call('HMGET', KEYS[2], unpack(ids))
local out, acked = {}, {}
for i = 1, n do
  if metas[i] == 'i|' .. ARGV[5 + (i - 1) * 5 + 1] then acked[#acked + 1] = ids[i]; out[i] = '1' else out[i] = '0' end
end
if #acked > 0 then
  redis.call('ZREM', KEYS[3], unpack(acked))
  redis.call('HDEL', KEYS[1], unpack(acked))
  redis.call('HDEL', KEYS[2], unpack(acked))
end
return out
