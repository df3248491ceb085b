-- Frozen: the schema and a few rows exactly as migration 0001 left them (user_version 1).
-- Never edit; TestUpgradeFrozenV1 proves every later migration upgrades it without loss.
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
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
INSERT INTO sessions VALUES('default',NULL,'ready','',0,'',1767225600000,1767225600000);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES sessions(id),
    kind        TEXT    NOT NULL,
    content     TEXT    NOT NULL CHECK (json_valid(content)),
    occurred_at INTEGER NOT NULL,
    received_at INTEGER NOT NULL
);
INSERT INTO events VALUES(1,'default','operator.input','{"text":"from v1","source_kind":"operator","source_key":"v1-key","conversation":"operator","author":"operator"}',1767225600000,1767225600001);
CREATE TABLE session_items (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    event_id   INTEGER NOT NULL REFERENCES events(id),
    lane       TEXT    NOT NULL CHECK (lane IN ('input', 'scratchpad', 'cell', 'speech', 'notice')),
    at         INTEGER NOT NULL
);
INSERT INTO session_items VALUES(1,'default',1,'input',1767225600001);
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
INSERT INTO inputs VALUES(1,'default',1,'operator','v1-key','operator','operator',1767225600000,1767225600001);
CREATE TABLE attention_frames (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    context_epoch   INTEGER NOT NULL,
    policy_revision TEXT    NOT NULL,
    routing_handles TEXT    NOT NULL CHECK (json_valid(routing_handles)),
    created_at      INTEGER NOT NULL
);
CREATE TABLE inbox (
    input_id   INTEGER PRIMARY KEY REFERENCES inputs(id),
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    state      TEXT    NOT NULL DEFAULT 'pending'
               CHECK (state IN ('pending', 'claimed', 'consumed', 'cancelled')),
    frame_id   INTEGER REFERENCES attention_frames(id),
    updated_at INTEGER NOT NULL,
    CHECK ((state = 'consumed') = (frame_id IS NOT NULL))
);
INSERT INTO inbox VALUES(1,'default','pending',NULL,1767225600001);
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('session_items',1);
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE INDEX session_items_by_session ON session_items(session_id, seq);
CREATE TRIGGER session_items_append_only_update BEFORE UPDATE ON session_items
BEGIN SELECT RAISE(ABORT, 'session items are append-only'); END;
CREATE TRIGGER session_items_append_only_delete BEFORE DELETE ON session_items
BEGIN SELECT RAISE(ABORT, 'session items are append-only'); END;
CREATE TRIGGER attention_frames_immutable BEFORE UPDATE ON attention_frames
BEGIN SELECT RAISE(ABORT, 'attention frames are immutable'); END;
CREATE INDEX inbox_pending ON inbox(session_id, state, input_id);
CREATE TRIGGER inbox_transitions BEFORE UPDATE OF state ON inbox
WHEN NOT (
       (OLD.state = 'pending' AND NEW.state IN ('claimed', 'cancelled'))
    OR (OLD.state = 'claimed' AND NEW.state IN ('pending', 'consumed', 'cancelled'))
)
BEGIN SELECT RAISE(ABORT, 'illegal inbox transition'); END;
CREATE TRIGGER session_transitions BEFORE UPDATE OF state ON sessions
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'ready'   AND NEW.state IN ('running', 'paused', 'stopped'))
    OR (OLD.state = 'running' AND NEW.state IN ('ready', 'waiting', 'paused', 'stopped'))
    OR (OLD.state = 'waiting' AND NEW.state IN ('ready', 'running', 'paused', 'stopped'))
    OR (OLD.state = 'paused'  AND NEW.state IN ('ready', 'stopped'))
    OR (OLD.state = 'stopped' AND NEW.state IN ('ready'))
)
BEGIN SELECT RAISE(ABORT, 'illegal session transition'); END;
COMMIT;
