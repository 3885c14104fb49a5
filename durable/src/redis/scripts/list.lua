-- list.lua — one page of one index (pending, in flight or dead), after a cursor task.
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] due        sorted set: pending tasks, member = member(seq, id)
-- KEYS[3] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[4] dead       sorted set: dead ids
-- KEYS[5] payload    hash: id → payload
--
-- ARGV[1] label      'tw-list' (not read)
-- ARGV[2] filter     'pending', 'inflight' or 'dead'
-- ARGV[3] after      the cursor: the last id of the previous page ('' from the start)
-- ARGV[4] limit      most tasks in the page
-- ARGV[5] payloads   '1': the payloads, '0': their lengths
--
-- Reply: 'STALE' if the cursor is not in that index; else per task: id, record, lease end
-- ('' if not in flight), payload length (or the payload).
--
-- Invariants: reads only. Goes by rank (`ZRANK`, then `ZRANGE … LIMIT`): never the whole
-- set, at most `limit` entries.

local filter, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local index = KEYS[2]
if filter == 'inflight' then index = KEYS[3] elseif filter == 'dead' then index = KEYS[4] end
local start = 0
if after ~= '' then
  local cursor = after
  if filter == 'pending' then
    local m = redis.call('HGET', KEYS[1], after)
    if not m then return 'STALE' end
    local st, d, seq = parse(m)
    cursor = member(seq, after)
  end
  local rank = redis.call('ZRANK', index, cursor)
  if not rank then return 'STALE' end
  start = rank + 1
end
local out = {}
if limit <= 0 then return out end
for _, mem in ipairs(redis.call('ZRANGE', index, start, start + limit - 1)) do
  local id = mem
  if filter == 'pending' then id = string.sub(mem, 22) end
  local m = redis.call('HGET', KEYS[1], id)
  if m then
    table.insert(out, id)
    table.insert(out, m)
    table.insert(out, redis.call('ZSCORE', KEYS[3], id) or '')
    if ARGV[5] == '1' then
      table.insert(out, redis.call('HGET', KEYS[5], id) or '')
    else
      table.insert(out, fmt(redis.call('HSTRLEN', KEYS[5], id)))
    end
  end
end
return out
