-- floor: one record write, one payload write, one due-set insert per task; no checks.
local now = now_ms()
local n = (#ARGV - 4) / 5 -- ARGV[4]: `not after`, unread here
local payloads, records, members, out = {}, {}, {}, {}
local seq = redis.call('INCRBY', KEYS[5], n) - n
for i = 0, n - 1 do
  local a = 5 + i * 5
  local id = ARGV[a]
  seq = seq + 1
  payloads[#payloads + 1] = id; payloads[#payloads + 1] = ARGV[a + 1]
  records[#records + 1] = id; records[#records + 1] = 'p|0'
  members[#members + 1] = now; members[#members + 1] = id
  out[i + 1] = 'OK'
end
redis.call('HSET', KEYS[1], unpack(payloads))
redis.call('HSET', KEYS[2], unpack(records))
redis.call('ZADD', KEYS[3], unpack(members))
return out
