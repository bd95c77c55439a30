-- The Scheduler's clock (schedule.go).

-- name: databaseNow
-- The database's clock: the one clock every replica's Scheduler agrees on,
-- whatever their own clocks say.
SELECT clock_timestamp()
