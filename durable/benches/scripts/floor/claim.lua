-- floor: take due ids, read payloads, mark in flight with a token, lease in the in-flight set.
local now = now_ms()
local wanted = tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, wanted)
local head = {fmt(now), '', '', '0'}
if #due == 0 then return head end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, #due - 1)
local payloads = redis.call('HMGET', KEYS[6], unpack(due))
local last = redis.call('INCRBY', KEYS[5], #due)
local leases, records = {}, {}
for k, id in ipairs(due) do
  local tok = fmt(last - #due + k)
  leases[#leases + 1] = now + 5000; leases[#leases + 1] = id
  records[#records + 1] = id; records[#records + 1] = 'i|' .. tok
  head[#head + 1] = id; head[#head + 1] = fmt(now); head[#head + 1] = '1'; head[#head + 1] = tok; head[#head + 1] = payloads[k]
end
redis.call('ZADD', KEYS[3], unpack(leases))
redis.call('HSET', KEYS[1], unpack(records))
return head
