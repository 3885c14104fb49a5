-- schedule_recurring.lua — declares a recurring schedule (every period, or a cron expression).
--
-- KEYS[1] payload    hash: id → payload (of the schedule: each occurrence gets a copy)
-- KEYS[2] meta       hash: id → record; a schedule's reason is its definition
--                    `catch-up|last|kind|definition[|anchor]`
-- KEYS[3] due        sorted set: pending tasks and recurring schedules, score = due (ms)
-- KEYS[4] inflight   sorted set: in-flight ids (and claimed schedules), score = lease end
-- KEYS[5] dead       sorted set: dead ids, score = time of death
-- KEYS[6] seq        counter: schedule order
-- KEYS[7] idle       sorted set: idle workers (to wake one)
--
-- ARGV[1] label      'tw-recurring' (not read)
-- ARGV[2] id
-- ARGV[3] payload
-- ARGV[4] catch-up   'latest' or 'all'
-- ARGV[5] kind       'every' or 'cron'
-- ARGV[6] definition the period (ms) or the cron expression
-- ARGV[7] channel    the partition's wake channel
--
-- Reply: 'OK' (made or remade, due now), 'KEPT' (the same definition and payload again: kept
-- as it is), or 'INFLIGHT' (a task of that id is in flight: nothing changed).
--
-- Invariants: declaring the same schedule again changes nothing, so every process may declare
-- it at start. A (re)made schedule owes nothing up to now, nor up to what a schedule it
-- replaces had made; the first worker to claim it computes its next occurrence.

local now = now_ms()
local id, catch, kind, def = ARGV[2], ARGV[4], ARGV[5], ARGV[6]
local last = now
local m = redis.call('HGET', KEYS[2], id)
if m then
  local st, d, seq, att, tok, reason, call = parse(m)
  if st == 'i' then return 'INFLIGHT' end
  if st == 'r' or st == 'R' then
    local c, l, k, rest = string.match(reason, '^([^|]*)|(%d+)|([^|]*)|(.*)$')
    local old_def = rest
    if k == 'every' then old_def = string.match(rest, '^([^|]*)') end
    if c == catch and k == kind and old_def == def and
       redis.call('HGET', KEYS[1], id) == ARGV[3] then
      return 'KEPT'
    end
    last = math.max(last, tonumber(l))
  end
  if st == 'p' or st == 'r' then redis.call('ZREM', KEYS[3], member(seq, id)) end
  if st == 'R' then redis.call('ZREM', KEYS[4], id) end
  if st == 'd' then redis.call('ZREM', KEYS[5], id) end
end
local spec = catch .. '|' .. fmt(last) .. '|' .. kind .. '|' .. def
if kind == 'every' then spec = spec .. '|' .. fmt(now) end
local seq = redis.call('INCR', KEYS[6])
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('HSET', KEYS[2], id, record('r', now, seq, 0, '0', spec, ''))
announce(KEYS[3], ARGV[7], KEYS[7], now, now)
redis.call('ZADD', KEYS[3], now, member(seq, id))
return 'OK'
