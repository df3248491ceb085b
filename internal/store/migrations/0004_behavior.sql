-- 0004: behavior releases, per-session activation, hook invocations.

CREATE TABLE behavior_releases (
    id           TEXT    PRIMARY KEY CHECK (length(id) = 64),
    manifest     TEXT    NOT NULL CHECK (json_valid(manifest)),
    published_at INTEGER NOT NULL
);

-- The session's active behavior: the epoch is the compare-and-swap token.
ALTER TABLE sessions ADD COLUMN behavior_epoch INTEGER NOT NULL DEFAULT 0;

-- Every activation, in epoch order: the authority for what a session runs.
CREATE TABLE activations (
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    epoch        INTEGER NOT NULL CHECK (epoch >= 1),
    release_id   TEXT    NOT NULL REFERENCES behavior_releases(id),
    kind         TEXT    NOT NULL CHECK (kind IN ('initial', 'none', 'prompt', 'hooks', 'workbench', 'rollback', 'restore')),
    reason       TEXT    NOT NULL,
    activated_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, epoch)
);
CREATE TRIGGER activations_append_only BEFORE UPDATE ON activations
BEGIN SELECT RAISE(ABORT, 'activations are append-only'); END;

CREATE TABLE hook_invocations (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    slot         TEXT    NOT NULL,
    release_id   TEXT    NOT NULL,
    epoch        INTEGER NOT NULL,
    input_digest TEXT    NOT NULL,
    outcome      TEXT    NOT NULL CHECK (outcome IN ('ok', 'error', 'invalid', 'timeout', 'unavailable')),
    fallback     INTEGER NOT NULL CHECK (fallback IN (0, 1)),
    result       TEXT    CHECK (result IS NULL OR json_valid(result)),
    error        TEXT    NOT NULL DEFAULT '',
    latency_us   INTEGER NOT NULL,
    at           INTEGER NOT NULL
);
CREATE INDEX hook_invocations_by_session ON hook_invocations(session_id, id);
