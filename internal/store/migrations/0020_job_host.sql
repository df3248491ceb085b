-- compat: readable-by-previous
-- 0018: the worker host a job's current attempt was dispatched to ('' here,
-- or not dispatched). Written before the attempt's unit is started there, so
-- that after a restart klbr-core asks that host for the unit and reattaches
-- to it instead of deciding by the recovery policy alone.
ALTER TABLE jobs ADD COLUMN host TEXT NOT NULL DEFAULT '';
