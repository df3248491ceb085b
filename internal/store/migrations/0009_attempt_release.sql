-- 0009: an attempt runs under the behavior release that was active when it
-- began (its prompt, attention policy and hooks); the attempt names it. An
-- activation during the attempt applies from the next one.
ALTER TABLE attempts ADD COLUMN release TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN behavior_epoch INTEGER NOT NULL DEFAULT 0;

-- A scratch table for the storage probe: after a write failed (a full disk),
-- klbr-core writes and deletes 64 KB here to learn whether writes of a
-- real size succeed again. It is empty between probes.
CREATE TABLE storage_probe (
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
