-- prelude.lua — the functions every script of the queue shares: the server's clock, the
-- task record, and targeted wake-ups. Each script is sent as this file followed by its own
-- (see scripts.rs), so these are in scope in every script. Defines no KEYS or ARGV of its own.
--
--   now_ms()           the server's clock (`TIME`) in ms: the one clock that judges due times,
--                      leases and mark windows.
--   fmt(n)             an integer as decimal text (never "1e+12").
--   member(seq, id)    a task's member in the due set: its schedule sequence zero-padded to
--                      20 digits, ':', its id — so tasks due at the same ms go in schedule
--                      order, and the id starts at byte 22.
--   parse(m)           a task's record `state|due|seq|attempts|token|call|reason` →
--                      state, due, seq, attempts, token, reason, call (note: reason before call).
--   record(...)        the inverse of parse, same argument order as parse returns.
--   wake_one(idle)     wakes one idle worker to claim now.
--   announce(...)      tells workers of a task about to become pending, only if it is the
--                      earliest pending task.
--
-- A record's state: `p` pending, `i` in flight, `d` dead, `r` a recurring schedule, `R` a
-- recurring schedule claimed by a worker that advances it.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(n) return string.format('%d', n) end
local function member(seq, id) return string.format('%020d', seq) .. ':' .. id end
-- A task's record: state|due|seq|attempts|token|call|reason, `call` naming the schedule
-- call that made it (so that call, retried after a lost reply, is recognised).
local function parse(m)
  local st, d, seq, att, tok, call, reason =
    string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  return st, tonumber(d), tonumber(seq), tonumber(att), tok, reason, call
end
-- One C call builds the whole record (the same text as formatting each number apart).
local function record(st, d, seq, att, tok, reason, call)
  return string.format('%s|%d|%d|%d|%s|%s|%s', st, d, seq, att, tok, call or '', reason)
end
-- Wakes one idle worker (one with room for more that found nothing to claim) to claim now;
-- the message names the idle set, so the worker knows which partition.
-- A worker that is gone has no subscriber on its channel: try the next.
local function wake_one(idle)
  for _ = 1, 8 do
    local worker = redis.call('ZPOPMIN', idle)
    if #worker == 0 then return end
    if redis.call('PUBLISH', worker[1], idle) > 0 then return end
  end
end
-- Before a task becomes pending at `due`: only if it is earlier than every pending task (so
-- earlier than anything a worker knows of), wake one idle worker if it is due already, or tell
-- every worker its due time (they re-arm their wheels; no call) if it is not.
local function announce(duekey, channel, idle, due, now)
  local head = redis.call('ZRANGE', duekey, 0, 0, 'WITHSCORES')
  if head[2] == nil or due < tonumber(head[2]) then
    if due <= now then wake_one(idle) else redis.call('PUBLISH', channel, fmt(due)) end
  end
end
