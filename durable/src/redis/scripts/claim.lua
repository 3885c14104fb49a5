-- claim.lua — one claim call of one worker on one partition: expired leases back to pending
-- (or to the dead letters), then due tasks handed out under a lease, with their payloads.
--
-- KEYS[1] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[2] due        sorted set: pending tasks and recurring schedules, score = due (ms)
-- KEYS[3] inflight   sorted set: in-flight ids (and claimed schedules), score = lease end
-- KEYS[4] dead       sorted set: dead ids, score = time of death
-- KEYS[5] token      counter: delivery tokens
-- KEYS[6] payload    hash: id → payload
-- KEYS[7] record     string `tw:{q}:claim:<claimer>`: this worker's last claim call that
--                    handed something out, `<call>|` then a msgpack array `id, token, …`
--                    (expires after a lease), so a retry of that call is answered again; the
--                    next call replaces it (the previous call's reply arrived, or this call
--                    would not be running)
-- KEYS[8] idle       sorted set: workers with room that found nothing due, score = since when
-- KEYS[9] stats      hash: the queue's counters
-- KEYS[10] lateness  list: lateness (ms) of the recent deliveries (1000 to 1100 of them)
-- KEYS[11] paused    string: set while the queue is paused (`pause.lua`)
--
-- ARGV[1] label      'tw-claim' (not read)
-- ARGV[2] lease      ms
-- ARGV[3] wanted     most tasks to hand out (0: only move expired leases)
-- ARGV[4] attempts   most deliveries of a task; a lease that expires on the last one kills it
-- ARGV[5] channel    the partition's wake channel
-- ARGV[6] batch      most expired leases moved by this call
-- ARGV[7] worker     this worker's own wake channel (its member in the idle set)
-- ARGV[8] call       this claim call's number (the same on every retry of it)
--
-- Reply: now (server ms), next due ('' if none), next lease end ('' if none), more ('1' if
-- expired leases remain beyond the batch), then per task handed out: id, due, attempt,
-- token, payload. A due recurring schedule is claimed like a task (state `R`, under a lease)
-- for the worker to advance, and returned with attempt 0 and its definition as payload.
--
-- Invariants: a task is handed out only with its exact payload, in one atomic step, under a
-- new token and a lease; a claim whose reply was lost is retried with the same record and
-- hands out the same tasks again (those still held by their tokens), nothing new. Never
-- touches more than `batch` expired leases and `wanted` due tasks. A worker left with room
-- (it claimed fewer than it wanted) joins the idle set, to be woken alone when a task
-- becomes due; one that filled up while due tasks remain wakes another. While the queue is
-- paused nothing is handed out (expired leases still move): a worker with room joins the idle
-- set, to be woken when the queue is resumed, and is told of no due time.

local now = now_ms()
local paused = redis.call('EXISTS', KEYS[11]) == 1
local lease = tonumber(ARGV[2])
local out = {}
-- A task goes out with its payload, read in this same script.
local function hand_out(id, d, att, tok)
  table.insert(out, id)
  table.insert(out, fmt(d))
  table.insert(out, fmt(att))
  table.insert(out, tok)
  table.insert(out, redis.call('HGET', KEYS[6], id) or '')
end
local more = 0
local nd = nil -- the due set's head, once read after this call's changes
local replay = {}
local recorded = redis.call('GET', KEYS[7])
local prefix = ARGV[8] .. '|'
if recorded and string.sub(recorded, 1, #prefix) == prefix then
  replay = cmsgpack.unpack(string.sub(recorded, #prefix + 1))
end
if #replay > 0 then
  -- This claim ran before and its reply was lost: hand out the same tasks again.
  for i = 1, #replay, 2 do
    local id, tok = replay[i], replay[i + 1]
    local m = redis.call('HGET', KEYS[1], id)
    if m then
      local st, d, seq, att, t, r = parse(m)
      if st == 'i' and t == tok then
        hand_out(id, d, att, tok)
      elseif st == 'R' and t == tok then
        table.insert(out, id)
        table.insert(out, fmt(d))
        table.insert(out, '0')
        table.insert(out, tok)
        table.insert(out, r)
      end
    end
  end
else
  local limit = tonumber(ARGV[6])
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  local announced = false
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[3], id)
    local m = redis.call('HGET', KEYS[1], id)
    if m then
      local st, d, seq, att, t, r, call = parse(m)
      if st == 'R' then
        -- A recurring schedule whose worker did not advance it: due again as it was.
        redis.call('HSET', KEYS[1], id, record('r', d, seq, 0, '0', r, call))
        redis.call('ZADD', KEYS[2], d, member(seq, id))
      elseif att >= tonumber(ARGV[4]) then
        redis.call('HSET', KEYS[1], id, record('d', d, seq, att, '0',
          'lease expired on delivery ' .. fmt(att) .. ' of ' .. ARGV[4], call))
        redis.call('ZADD', KEYS[4], now, id)
        redis.call('HINCRBY', KEYS[9], 'dead_lettered', 1)
      else
        redis.call('HINCRBY', KEYS[9], 'expired', 1)
        if not announced then
          announce(KEYS[2], ARGV[5], KEYS[8], now, now)
          announced = true
        end
        redis.call('HSET', KEYS[1], id, record('p', now, seq, att, '0', '', call))
        redis.call('ZADD', KEYS[2], now, member(seq, id))
      end
    end
  end
  if #expired == limit then more = 1 end
  local wanted = tonumber(ARGV[3])
  if paused and wanted > 0 then
    redis.call('ZADD', KEYS[8], now, ARGV[7])
    wanted = 0
  elseif wanted > 0 then
    local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, wanted)
    local late = {}
    if #due > 0 then
      -- The due tasks are the set's first #due members: one call removes them, one reads
      -- their records, one their payloads, one takes their tokens, and the writes below go
      -- out as one call each (a few calls per claim, not several per task).
      redis.call('ZREMRANGEBYRANK', KEYS[2], 0, #due - 1)
      local ids = {}
      for k, mem in ipairs(due) do ids[k] = string.sub(mem, 22) end
      local metas = redis.call('HMGET', KEYS[1], unpack(ids))
      local payloads = redis.call('HMGET', KEYS[6], unpack(ids))
      local last = redis.call('INCRBY', KEYS[5], #due)
      local leases, records, replays = {}, {}, {}
      -- Every lease of this call ends at once: its score is formatted once (a Lua number
      -- handed to a command is formatted by Redis as a double, at a cost per value).
      local lease_end = fmt(now + lease)
      local first_token = last - #due
      -- Arrays filled by index, not `table.insert` (a function call per value).
      local o = #out
      for k, id in ipairs(ids) do
        local st, d, seq, att, t, r, call = parse(metas[k])
        local tok = fmt(first_token + k)
        local two = 2 * k
        leases[two - 1], leases[two] = lease_end, id
        replays[two - 1], replays[two] = id, tok
        records[two - 1] = id
        local attempt, body = '0', r -- a recurring schedule: attempt 0, its definition
        if st == 'r' then
          records[two] = record('R', d, seq, 0, tok, r, call)
        else
          att = att + 1
          records[two] = record('i', d, seq, att, tok, '', call)
          attempt, body = fmt(att), payloads[k] or ''
          late[#late + 1] = fmt(math.max(now - d, 0))
        end
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
          id, fmt(d), attempt, tok, body
        o = o + 5
      end
      redis.call('ZADD', KEYS[3], unpack(leases))
      redis.call('SET', KEYS[7], prefix .. cmsgpack.pack(replays), 'PX', lease)
      redis.call('HSET', KEYS[1], unpack(records))
    end
    if #late > 0 then
      redis.call('HINCRBY', KEYS[9], 'delivered', #late)
      -- Trimmed back to 1000 only once it passes 1100: one call per claim, not two.
      if redis.call('RPUSH', KEYS[10], unpack(late)) > 1100 then
        redis.call('LTRIM', KEYS[10], -1000, -1)
      end
    end
    if #due < wanted then
      redis.call('ZADD', KEYS[8], now, ARGV[7])
    else
      redis.call('ZREM', KEYS[8], ARGV[7])
    end
  elseif not paused then
    redis.call('ZREM', KEYS[8], ARGV[7])
  end
  nd = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if paused then
    nd = {}
  elseif nd[2] and tonumber(nd[2]) <= now and (wanted == 0 or #out == wanted * 5) then
    -- Waking another worker changes no set this reply reads.
    wake_one(KEYS[8])
  end
end
nd = nd or redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local nl = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local head = {fmt(now), nd[2] or '', nl[2] or '', fmt(more)}
for i = 1, #out do head[i + 4] = out[i] end
return head
