-- kept_reply.lua — the reply a finish invocation kept, read by the same finish made again
-- after that invocation erred (its reply lost, or its replicas late): a finish is recognised
-- by its delivery, not only by its invocation.
--
-- KEYS[1] replied    string `tw:{q}:call:<invocation>`: the erred invocation's reply (msgpack)
--
-- ARGV[1] label      'tw-kept-reply' (not read)
-- ARGV[2] window     ms the reply is kept from now on
--
-- Reply: the kept reply (one answer per delivery of that invocation, in order), or nil if
-- that invocation never ran or its reply expired.
--
-- Invariants: reads one key; renews its window, a write, so that `WAIT` after it covers
-- what the erred invocation did.

local replied = redis.call('GET', KEYS[1])
if not replied then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return cmsgpack.unpack(replied)
