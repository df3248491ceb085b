-- 0013: durable jobs. One model for tracked commands, scheduled routines and
-- sources (child agents later): a job belongs to a session, is pinned to the
-- behavior release that made it, carries its recovery policy, and moves
-- through explicit states that the trigger below enforces.

-- Jobs speak to their owner through inputs: a job's completion ('job') and a
-- source's events ('source'). Widening a CHECK changes no stored row, so the
-- table definition is edited in place (SQLite's documented procedure for
-- schema changes that leave the file format alone); RESET makes this
-- connection read the edited schema at once.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, 'CHECK (source_kind IN (''operator'', ''discord''))',
                       'CHECK (source_kind IN (''operator'', ''discord'', ''job'', ''source''))')
WHERE type = 'table' AND name = 'inputs';
PRAGMA writable_schema = RESET;

CREATE TABLE jobs (
    id          INTEGER PRIMARY KEY,
    kind        TEXT    NOT NULL CHECK (kind IN ('command', 'routine', 'source', 'child')),
    session_id  TEXT    NOT NULL REFERENCES sessions(id),
    parent_id   INTEGER REFERENCES jobs(id),
    release     TEXT    NOT NULL DEFAULT '', -- the behavior release it is pinned to
    workspace   TEXT    NOT NULL DEFAULT '',
    spec        TEXT    NOT NULL CHECK (json_valid(spec)),   -- argv/cwd/env/timeout, or entry/input
    budget      TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(budget)),
    recovery    TEXT    NOT NULL CHECK (recovery IN ('retry_safe', 'resume', 'manual')),
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'unknown')),
    priority    INTEGER NOT NULL DEFAULT 0,
    -- The schedule: {"at": ms} | {"every": ms} | {"cron": "m h dom mon dow"}; NULL: run now.
    schedule    TEXT    CHECK (schedule IS NULL OR json_valid(schedule)),
    tz          TEXT    NOT NULL DEFAULT 'UTC',
    next_due    INTEGER, -- unix ms, UTC: the next deadline while pending and scheduled
    runs        INTEGER NOT NULL DEFAULT 0, -- runs started
    result      TEXT    CHECK (result IS NULL OR json_valid(result)),
    error       TEXT    NOT NULL DEFAULT '',
    output_artifact TEXT NOT NULL DEFAULT '',
    output_preview  TEXT NOT NULL DEFAULT '',
    output_bytes    INTEGER NOT NULL DEFAULT 0,
    checkpoint  TEXT    CHECK (checkpoint IS NULL OR json_valid(checkpoint)),
    cursor      TEXT    CHECK (cursor IS NULL OR json_valid(cursor)),
    created_at  INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER,
    updated_at  INTEGER NOT NULL,
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'unknown')) = (finished_at IS NOT NULL)),
    -- Only a pending job has a deadline, so the timer reads jobs_due alone.
    CHECK (next_due IS NULL OR state = 'pending')
);
CREATE INDEX jobs_by_session ON jobs(session_id, id);
CREATE INDEX jobs_by_state ON jobs(state);
CREATE INDEX jobs_due ON jobs(next_due) WHERE next_due IS NOT NULL;

-- The job lifecycle, enforced here as well as in internal/jobs (a test keeps
-- them equal). running → pending re-arms a recurring job for its next period,
-- or a retry_safe/resume job recovered after a restart.
CREATE TRIGGER jobs_transitions BEFORE UPDATE OF state ON jobs
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'pending' AND NEW.state IN ('running', 'cancelled'))
    OR (OLD.state = 'running' AND NEW.state IN ('pending', 'succeeded', 'failed', 'cancelled', 'unknown'))
)
BEGIN SELECT RAISE(ABORT, 'illegal job transition'); END;
CREATE TRIGGER jobs_final BEFORE UPDATE ON jobs
WHEN OLD.state IN ('succeeded', 'failed', 'cancelled', 'unknown')
BEGIN SELECT RAISE(ABORT, 'a finished job does not change'); END;
