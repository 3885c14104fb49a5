-- schedule.lua — makes (or replaces) a batch of tasks, each pending at its due time: one
-- `schedule` call, concurrent calls gathered into one invocation, or a `schedule_many` chunk.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] due        sorted set: pending tasks, score = due (ms), member = member(seq, id)
-- KEYS[4] dead       sorted set: dead ids, score = time of death
-- KEYS[5] seq        counter: schedule order
-- KEYS[6] idle       sorted set: workers with room that found nothing due (to wake one)
-- KEYS[7] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[8] replied    string `tw:{q}:call:<invocation>`: this invocation's reply (msgpack),
--                    written here and kept for `window` ms, so a retry of it is answered again
--
-- ARGV[1] label      'tw-schedule' (not read)
-- ARGV[2] channel    the partition's wake channel
-- ARGV[3] window     ms the reply is kept (a lease, at least the client's retry span)
-- ARGV[4] not after  server ms after which this invocation must not act: its caller has
--                    stopped sending it, and its kept reply may be gone (a copy delayed in
--                    the network, arriving after that, would make its tasks again)
-- ARGV[5..] tasks    five per task, in order: id, payload, mode ('at': ms is a time, ms since
--                    the epoch; 'after': a delay, added to the server's clock, so the caller's
--                    clock never decides), ms, call (that task's call id, kept in its record)
--
-- Reply: per task, in order: 'OK' (scheduled, or already scheduled by this call), or
-- 'INFLIGHT' (a delivery of that id is in flight: that task changed nothing).
--
-- Invariants: tasks are taken in order, each exactly as a batch of one would take it (a later
-- task of the same id replaces an earlier one; ties in due time go in this order). One
-- record per id — a pending, dead or recurring task of the same id is removed from its index
-- before it is replaced, an in-flight one is never replaced. An invocation retried after a
-- lost reply is answered from its kept reply without acting again (one record per
-- invocation, not a mark per task): a retry never makes a task again, even one acked since;
-- one arriving after `not after` (its reply may have expired) is refused and does nothing.
-- The caller sends at most a bounded batch (see batch.rs).

local replied = redis.call('GET', KEYS[8])
if replied then return cmsgpack.unpack(replied) end
local now = now_ms()
if now > tonumber(ARGV[4]) then
  return redis.error_reply('tw-expired: this schedule invocation arrived after its caller ' ..
    'stopped retrying it; it did nothing')
end
local out = {}
local n = (#ARGV - 4) / 5
-- New tasks are written together (one HSET per hash, one ZADD) when the loop ends or before
-- an id already written in this batch is looked at again; the due set's head is tracked
-- here, as the writes would move it, and read again after a removal.
local payloads, records, members, fresh = {}, {}, {}, {}
local function flush()
  if #members > 0 then
    redis.call('HSET', KEYS[1], unpack(payloads))
    redis.call('HSET', KEYS[2], unpack(records))
    redis.call('ZADD', KEYS[3], unpack(members))
    payloads, records, members, fresh = {}, {}, {}, {}
  end
end
local function head_due()
  local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  return tonumber(head[2])
end
local head = head_due()
-- Every task's record in one call; an id met again in this batch is read again.
local ids = {}
for i = 0, n - 1 do ids[i + 1] = ARGV[5 + i * 5] end
local metas = redis.call('HMGET', KEYS[2], unpack(ids))
local met = {}
-- Sequence numbers for the whole batch at once (unused ones leave gaps: only order counts).
local seq_next = redis.call('INCRBY', KEYS[5], n) - n
for i = 0, n - 1 do
  local a = 5 + i * 5
  local id, payload, mode, ms, call = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local due = tonumber(ms)
  if mode == 'after' then due = now + due end
  if fresh[id] then flush() end
  local answer = nil
  local m = metas[i + 1]
  if met[id] then m = redis.call('HGET', KEYS[2], id) end
  met[id] = true
  if m then
    local st, d, seq, att, tok, reason, c = parse(m)
    if c == call then
      answer = 'OK' -- this call again, its kept reply gone (evicted under volatile-*)
    elseif st == 'i' then
      answer = 'INFLIGHT'
    else
      if st == 'p' or st == 'r' then
        flush() -- the head is read again below, with this batch's tasks in the set
        redis.call('ZREM', KEYS[3], member(seq, id))
        head = head_due()
      end
      if st == 'd' then redis.call('ZREM', KEYS[4], id) end
      if st == 'R' then redis.call('ZREM', KEYS[7], id) end
    end
  end
  if answer == nil then
    seq_next = seq_next + 1
    -- Only a task earlier than every pending one is announced (see `announce`).
    if head == nil or due < head then
      if due <= now then wake_one(KEYS[6]) else redis.call('PUBLISH', ARGV[2], fmt(due)) end
      head = due
    end
    local w = #members
    payloads[w + 1], payloads[w + 2] = id, payload
    records[w + 1], records[w + 2] = id, record('p', due, seq_next, 0, '0', '', call)
    -- The score as text: a Lua number handed to a command is formatted as a double.
    members[w + 1], members[w + 2] = fmt(due), member(seq_next, id)
    fresh[id] = true
    answer = 'OK'
  end
  out[i + 1] = answer
end
flush()
redis.call('SET', KEYS[8], cmsgpack.pack(out), 'PX', ARGV[3])
return out
