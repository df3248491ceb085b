-- 0002: cells and kernel generations.

-- The session's current workbench generation; bumped each time a new one starts.
ALTER TABLE sessions ADD COLUMN kernel_generation INTEGER NOT NULL DEFAULT 0;

-- One row per cell: accepted (running) before it runs, finished with its outcome.
CREATE TABLE executions (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    generation      INTEGER NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'running'
                    CHECK (state IN ('running', 'ok', 'error', 'cancelled', 'yielded', 'lost')),
    reset           INTEGER NOT NULL DEFAULT 0 CHECK (reset IN (0, 1)),
    code_event_id   INTEGER NOT NULL REFERENCES events(id),
    outcome_event_id INTEGER REFERENCES events(id),
    started_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    CHECK ((state = 'running') = (finished_at IS NULL))
);
CREATE INDEX executions_by_session ON executions(session_id, id);
CREATE TRIGGER executions_finish_once BEFORE UPDATE OF state ON executions
WHEN OLD.state <> 'running' OR NEW.state = 'running'
BEGIN SELECT RAISE(ABORT, 'an execution finishes once'); END;
