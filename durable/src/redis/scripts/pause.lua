-- pause.lua — pauses or resumes claiming on one partition (every partition of a queue gets
-- the same call).
--
-- KEYS[1] paused     string: set while paused (read by `claim.lua`)
-- KEYS[2] idle       sorted set: workers with room that found nothing to claim
--
-- ARGV[1] label      'tw-pause' (not read)
-- ARGV[2] pause      '1' to pause, '0' to resume
--
-- Reply: 1.
--
-- Invariants: a resume wakes every idle worker of the partition (while paused, a worker with
-- room waits in the idle set, told of no due time), so each claims at once. The idle set
-- holds one member per worker: bounded by the number of workers, at most 1000 a call.

if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], '1')
  return 1
end
redis.call('DEL', KEYS[1])
local workers = redis.call('ZPOPMIN', KEYS[2], 1000)
for i = 1, #workers, 2 do
  redis.call('PUBLISH', workers[i], KEYS[2])
end
return 1
