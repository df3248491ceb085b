-- 0009: an attempt runs under the behavior release that was active when it
-- began (its prompt, attention policy and hooks); the attempt names it. An
-- activation during the attempt applies from the next one.
ALTER TABLE attempts ADD COLUMN release TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN behavior_epoch INTEGER NOT NULL DEFAULT 0;
