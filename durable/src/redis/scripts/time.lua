-- time.lua — the server's clock on a partition's node, for a handle to date its schedule
-- invocations in server time (see `schedule.lua`'s `not after`).
--
-- KEYS[1] any key of the partition (names the node the call goes to; not read)
--
-- ARGV[1] label      'tw-time' (not read)
--
-- Reply: the server's clock (`TIME`) in ms.
--
-- Invariants: reads and writes nothing.

return now_ms()
