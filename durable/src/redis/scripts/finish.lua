-- finish.lua — ends a batch of deliveries, each by ack (delete), retry (pending again after a
-- delay), or dead (to the dead letters with a reason): one finish call, or concurrent
-- finishes of one partition gathered into one invocation.
--
-- KEYS[1] payload    hash: id → payload
-- KEYS[2] meta       hash: id → record `state|due|seq|attempts|token|call|reason`
-- KEYS[3] inflight   sorted set: in-flight ids, score = lease end
-- KEYS[4] due        sorted set: pending tasks, score = due (ms)
-- KEYS[5] dead       sorted set: dead ids, score = time of death
-- KEYS[6] idle       sorted set: idle workers (to wake one)
-- KEYS[7] stats      hash: the queue's counters
-- KEYS[8] replied    string `tw:{q}:call:<invocation>`: this invocation's reply (msgpack),
--                    written here and kept for `window` ms, so a retry of it is answered again
--
-- ARGV[1] label      'tw-finish' (not read)
-- ARGV[2] channel    the partition's wake channel
-- ARGV[3] attempts   most deliveries of a task: a retry of the last one goes to the dead letters
-- ARGV[4] window     ms the reply is kept (a lease, at least the client's retry span)
-- ARGV[5..] finishes five per delivery, in order: id, token (the delivery being finished),
--                    outcome ('ack', 'retry' or 'dead'), delay (ms before a retry is due),
--                    reason (why it died)
--
-- Reply: per delivery, in order: '1' if its finish took effect, '0' if the lease was lost —
-- including a second, different finish of the same delivery. A retried invocation gets the
-- reply its first run made.
--
-- Invariants: only the holder of the current delivery (its token) changes the task, and only
-- once; each delivery is judged on its own, in order, as a batch of one would be. An
-- invocation retried after a lost reply is answered from its kept reply without acting
-- again (one record per invocation, not a mark per delivery). The caller sends at most a
-- bounded batch (see batch.rs).

local replied = redis.call('GET', KEYS[8])
if replied then return cmsgpack.unpack(replied) end
local out = {}
local n = (#ARGV - 4) / 5
local now = nil
-- Acks are written together after the loop (one ZREM, two HDEL, one HINCRBY for the batch);
-- an id acked earlier in this batch counts as gone for the entries after it.
local acked, gone = {}, {}
-- Every record in one call; an id met again in this batch is read again.
local ids = {}
for i = 0, n - 1 do ids[i + 1] = ARGV[5 + i * 5] end
local metas = redis.call('HMGET', KEYS[2], unpack(ids))
local met = {}
for i = 0, n - 1 do
  local a = 5 + i * 5
  local id, tok, outcome = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local delay, why = ARGV[a + 3], ARGV[a + 4]
  local done = '0'
  local m = metas[i + 1]
  if gone[id] then
    m = nil
  elseif met[id] then
    m = redis.call('HGET', KEYS[2], id)
  end
  met[id] = true
  local st, d, seq, att, t, r, call
  if m then st, d, seq, att, t, r, call = parse(m) end
  if m and st == 'i' and t == tok then
    if outcome == 'ack' then
      table.insert(acked, id) -- deleted after the loop
      gone[id] = true
    elseif outcome == 'retry' and att < tonumber(ARGV[3]) then
      redis.call('ZREM', KEYS[3], id)
      now = now or now_ms()
      local due = now + tonumber(delay)
      redis.call('HSET', KEYS[2], id, record('p', due, seq, att, '0', '', call))
      announce(KEYS[4], ARGV[2], KEYS[6], due, now)
      redis.call('ZADD', KEYS[4], due, member(seq, id))
      redis.call('HINCRBY', KEYS[7], 'retried', 1)
    else
      local reason = why
      if outcome == 'retry' then
        reason = 'retried on its last delivery (' .. fmt(att) .. ' of ' .. fmt(att) .. ')'
      end
      now = now or now_ms()
      redis.call('ZREM', KEYS[3], id)
      redis.call('HSET', KEYS[2], id, record('d', d, seq, att, '0', reason, call))
      redis.call('ZADD', KEYS[5], now, id)
      redis.call('HINCRBY', KEYS[7], 'dead_lettered', 1)
    end
    done = '1'
  end
  table.insert(out, done)
end
if #acked > 0 then
  redis.call('ZREM', KEYS[3], unpack(acked))
  redis.call('HDEL', KEYS[1], unpack(acked))
  redis.call('HDEL', KEYS[2], unpack(acked))
  redis.call('HINCRBY', KEYS[7], 'acked', #acked)
end
redis.call('SET', KEYS[8], cmsgpack.pack(out), 'PX', ARGV[4])
return out
