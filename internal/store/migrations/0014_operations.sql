-- compat: readable-by-previous
-- 0014: operations. Which binaries can still run on this file (the upgrade
-- path), and tombstones of what garbage collection removed.

-- readable_by: the oldest schema version whose klbr-core may run on this
-- file. A migration marked "compat: readable-by-previous" (only additions
-- an older binary ignores) keeps the file readable by the binary one
-- version back, so rolling back the binary keeps working; any other
-- migration sets it to its own version.
CREATE TABLE schema_info (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    readable_by INTEGER NOT NULL
);
INSERT INTO schema_info (id, readable_by) VALUES (1, 0); -- set by the migrator after each migration

-- What garbage collection removed, and why: a release directory or an
-- artifact file is gone, its tombstone stays.
CREATE TABLE tombstones (
    id         INTEGER PRIMARY KEY,
    kind       TEXT    NOT NULL CHECK (kind IN ('release', 'artifact')),
    ref        TEXT    NOT NULL CHECK (length(ref) = 64),
    size       INTEGER NOT NULL,
    reason     TEXT    NOT NULL CHECK (length(reason) > 0),
    removed_at INTEGER NOT NULL,
    UNIQUE (kind, ref)
);
