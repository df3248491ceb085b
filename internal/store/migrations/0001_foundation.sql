-- 0001: the foundation families. Each migration runs in one transaction.

-- Who holds the data directory. One row; rewritten by each owner at start.
CREATE TABLE owner (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    pid        INTEGER NOT NULL,
    host       TEXT    NOT NULL,
    started_at INTEGER NOT NULL -- unix milliseconds
);

CREATE TABLE sessions (
    id              TEXT    PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    parent_id       TEXT    REFERENCES sessions(id),
    state           TEXT    NOT NULL DEFAULT 'ready'
                    CHECK (state IN ('ready', 'running', 'waiting', 'paused', 'stopped')),
    state_reason    TEXT    NOT NULL DEFAULT '',
    context_epoch   INTEGER NOT NULL DEFAULT 0,
    policy_revision TEXT    NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

-- Append-only originals. Content is stored here once; everything else points at it.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES sessions(id),
    kind        TEXT    NOT NULL,
    content     TEXT    NOT NULL CHECK (json_valid(content)),
    occurred_at INTEGER NOT NULL,
    received_at INTEGER NOT NULL
);
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

-- The ordered, per-session view of events. seq is the durable cursor clients resume from.
CREATE TABLE session_items (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    event_id   INTEGER NOT NULL REFERENCES events(id),
    lane       TEXT    NOT NULL CHECK (lane IN ('input', 'scratchpad', 'cell', 'speech', 'notice')),
    at         INTEGER NOT NULL
);
CREATE INDEX session_items_by_session ON session_items(session_id, seq);
CREATE TRIGGER session_items_append_only_update BEFORE UPDATE ON session_items
BEGIN SELECT RAISE(ABORT, 'session items are append-only'); END;
CREATE TRIGGER session_items_append_only_delete BEFORE DELETE ON session_items
BEGIN SELECT RAISE(ABORT, 'session items are append-only'); END;

-- Admitted inputs: the canonical identity of each source message.
CREATE TABLE inputs (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    event_id     INTEGER NOT NULL UNIQUE REFERENCES events(id),
    source_kind  TEXT    NOT NULL CHECK (source_kind IN ('operator', 'discord')),
    source_key   TEXT    NOT NULL CHECK (length(source_key) BETWEEN 1 AND 256),
    conversation TEXT    NOT NULL,
    author       TEXT    NOT NULL,
    occurred_at  INTEGER NOT NULL,
    received_at  INTEGER NOT NULL,
    UNIQUE (session_id, source_key)
);

-- Frozen attention frames: what a model request consumed and under which versions.
CREATE TABLE attention_frames (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    context_epoch   INTEGER NOT NULL,
    policy_revision TEXT    NOT NULL,
    routing_handles TEXT    NOT NULL CHECK (json_valid(routing_handles)),
    created_at      INTEGER NOT NULL
);
CREATE TRIGGER attention_frames_immutable BEFORE UPDATE ON attention_frames
BEGIN SELECT RAISE(ABORT, 'attention frames are immutable'); END;

-- Scheduling state of each input. Consumed only as a consequence of a committed frame.
CREATE TABLE inbox (
    input_id   INTEGER PRIMARY KEY REFERENCES inputs(id),
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    state      TEXT    NOT NULL DEFAULT 'pending'
               CHECK (state IN ('pending', 'claimed', 'consumed', 'cancelled')),
    frame_id   INTEGER REFERENCES attention_frames(id),
    updated_at INTEGER NOT NULL,
    CHECK ((state = 'consumed') = (frame_id IS NOT NULL))
);
CREATE INDEX inbox_pending ON inbox(session_id, state, input_id);
CREATE TRIGGER inbox_transitions BEFORE UPDATE OF state ON inbox
WHEN NOT (
       (OLD.state = 'pending' AND NEW.state IN ('claimed', 'cancelled'))
    OR (OLD.state = 'claimed' AND NEW.state IN ('pending', 'consumed', 'cancelled'))
)
BEGIN SELECT RAISE(ABORT, 'illegal inbox transition'); END;

-- The session lifecycle, enforced here as well as in internal/session (a test keeps them equal).
CREATE TRIGGER session_transitions BEFORE UPDATE OF state ON sessions
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'ready'   AND NEW.state IN ('running', 'paused', 'stopped'))
    OR (OLD.state = 'running' AND NEW.state IN ('ready', 'waiting', 'paused', 'stopped'))
    OR (OLD.state = 'waiting' AND NEW.state IN ('ready', 'running', 'paused', 'stopped'))
    OR (OLD.state = 'paused'  AND NEW.state IN ('ready', 'stopped'))
    OR (OLD.state = 'stopped' AND NEW.state IN ('ready'))
)
BEGIN SELECT RAISE(ABORT, 'illegal session transition'); END;
