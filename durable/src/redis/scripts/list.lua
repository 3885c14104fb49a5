-- list.lua — one page of one index (pending, in flight or dead), after a cursor task or
-- after a position.
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
-- ARGV[6] score      a position instead of a cursor task ('' for none): its score …
-- ARGV[7] position   … and its member; the page starts after (score, member)
--
-- Reply: 'STALE' if the cursor task is not in that index; else per task: id, record, lease
-- end ('' if not in flight), payload length (or the payload), its score in the index, and
-- its schedule sequence ('0' outside the pending index).
--
-- Invariants: reads only. Goes by rank (`ZRANK`, or a binary search among the entries of
-- the position's score: O(log² n)), then `ZRANGE … LIMIT`: never the whole set, at most
-- `limit` entries.

local filter, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local index = KEYS[2]
if filter == 'inflight' then index = KEYS[3] elseif filter == 'dead' then index = KEYS[4] end
-- Whether member a sorts at or before b (byte order, as a sorted set's members of equal
-- score; Lua's own comparison follows the locale).
local function at_or_before(a, b)
  if a == b then return true end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local start = 0
if ARGV[6] ~= '' then
  local score, position = ARGV[6], ARGV[7]
  local lo = redis.call('ZCOUNT', index, '-inf', '(' .. score)
  local hi = redis.call('ZCOUNT', index, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at_or_before(redis.call('ZRANGE', index, mid, mid)[1], position) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  start = lo
elseif after ~= '' then
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
local range = redis.call('ZRANGE', index, start, start + limit - 1, 'WITHSCORES')
for i = 1, #range, 2 do
  local mem, score = range[i], range[i + 1]
  local id, seq = mem, '0'
  if filter == 'pending' then id, seq = string.sub(mem, 22), string.sub(mem, 1, 20) end
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
    table.insert(out, score)
    table.insert(out, seq)
  end
end
return out
