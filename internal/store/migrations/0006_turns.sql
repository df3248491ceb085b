-- 0006: the turn loop. An attempt is one run of model steps that a frame or
-- a wake started; a step is one model request; a tool call is one call of the
-- python tool in a step's response. context_items is the model-visible
-- transcript of each context epoch, pointing at events (content is stored
-- once, in events). wakeups are persisted wait deadlines.

-- A DM, a mention or any operator input: it demands attention.
ALTER TABLE inputs ADD COLUMN directed INTEGER NOT NULL DEFAULT 0 CHECK (directed IN (0, 1));

CREATE TABLE attempts (
    id            INTEGER PRIMARY KEY,
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    frame_id      INTEGER REFERENCES attention_frames(id),
    wake_reason   TEXT    NOT NULL,
    context_epoch INTEGER NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'running'
                  CHECK (state IN ('running', 'idle', 'waiting', 'paused', 'interrupted', 'failed')),
    outcome       TEXT    NOT NULL DEFAULT '',
    steps         INTEGER NOT NULL DEFAULT 0,
    tokens        INTEGER NOT NULL DEFAULT 0,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    CHECK ((state = 'running') = (finished_at IS NULL))
);
CREATE INDEX attempts_by_session ON attempts(session_id, id);
CREATE TRIGGER attempts_finish_once BEFORE UPDATE OF state ON attempts
WHEN OLD.state <> 'running'
BEGIN SELECT RAISE(ABORT, 'an attempt finishes once'); END;

-- Frames an attempt took in at its step boundaries, after the one that started it.
CREATE TABLE attempt_frames (
    attempt_id INTEGER NOT NULL REFERENCES attempts(id),
    frame_id   INTEGER NOT NULL UNIQUE REFERENCES attention_frames(id),
    PRIMARY KEY (attempt_id, frame_id)
);

CREATE TABLE model_steps (
    id            INTEGER PRIMARY KEY,
    attempt_id    INTEGER NOT NULL REFERENCES attempts(id),
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    route         TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'requested'
                  CHECK (state IN ('requested', 'completed', 'failed', 'interrupted')),
    error         TEXT    NOT NULL DEFAULT '',
    response_event_id INTEGER REFERENCES events(id),
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER
);
CREATE INDEX model_steps_by_attempt ON model_steps(attempt_id, id);
CREATE TRIGGER model_steps_finish_once BEFORE UPDATE OF state ON model_steps
WHEN OLD.state <> 'requested'
BEGIN SELECT RAISE(ABORT, 'a model step finishes once'); END;

-- One call of the python tool. Its result is a cell outcome or an explicit
-- unrun result (invalid arguments, interrupted, skipped after a wait).
CREATE TABLE tool_calls (
    step_id       INTEGER NOT NULL REFERENCES model_steps(id),
    call_id       TEXT    NOT NULL CHECK (length(call_id) BETWEEN 1 AND 256),
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    position      INTEGER NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'done', 'invalid', 'interrupted', 'skipped')),
    execution_id  INTEGER REFERENCES executions(id),
    result_event_id INTEGER REFERENCES events(id),
    PRIMARY KEY (step_id, call_id),
    CHECK ((state = 'pending') = (result_event_id IS NULL))
);
CREATE TRIGGER tool_calls_answer_once BEFORE UPDATE OF state ON tool_calls
WHEN OLD.state <> 'pending'
BEGIN SELECT RAISE(ABORT, 'a tool call is answered once'); END;

-- The cell a tool call ran as; its outcome answers the call in the same commit.
ALTER TABLE executions ADD COLUMN step_id INTEGER REFERENCES model_steps(id);
ALTER TABLE executions ADD COLUMN call_id TEXT;

-- The model-visible transcript of each context epoch, in order.
CREATE TABLE context_items (
    id            INTEGER PRIMARY KEY,
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    context_epoch INTEGER NOT NULL,
    role          TEXT    NOT NULL CHECK (role IN ('input', 'assistant', 'tool', 'notice')),
    event_id      INTEGER NOT NULL REFERENCES events(id),
    call_id       TEXT,
    CHECK ((role = 'tool') = (call_id IS NOT NULL))
);
CREATE INDEX context_items_by_epoch ON context_items(session_id, context_epoch, id);
CREATE TRIGGER context_items_append_only BEFORE UPDATE ON context_items
BEGIN SELECT RAISE(ABORT, 'context items are append-only'); END;

-- A session's wait: armed until input or its deadline (NULL: input only)
-- wakes it; fired or cancelled once.
CREATE TABLE wakeups (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    attempt_id   INTEGER NOT NULL REFERENCES attempts(id),
    execution_id INTEGER REFERENCES executions(id),
    deadline     INTEGER,
    reason       TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'armed' CHECK (state IN ('armed', 'fired', 'cancelled')),
    fired_by     TEXT    NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    fired_at     INTEGER
);
CREATE UNIQUE INDEX wakeups_one_armed ON wakeups(session_id) WHERE state = 'armed';
CREATE TRIGGER wakeups_fire_once BEFORE UPDATE OF state ON wakeups
WHEN OLD.state <> 'armed'
BEGIN SELECT RAISE(ABORT, 'a wakeup fires once'); END;
