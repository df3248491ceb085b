-- 0012: durable observers and hook state.
--
-- observer_events holds each committed event an observer may be bound to,
-- written by triggers in the transaction that commits it (an admitted input,
-- a receipt, an ended attempt, an activation), or by the observer machinery
-- itself for the receipts of observer commands (with their causal depth).
CREATE TABLE observer_events (
    id            INTEGER PRIMARY KEY,
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    kind          TEXT    NOT NULL CHECK (kind IN ('input.accepted', 'delivery.receipt', 'turn.completed', 'revision.activated')),
    data          TEXT    NOT NULL CHECK (json_valid(data)),
    depth         INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0),
    cause_command INTEGER,
    created_at    INTEGER NOT NULL
);
CREATE INDEX observer_events_by_session ON observer_events(session_id, id);
CREATE TRIGGER observer_events_append_only BEFORE UPDATE ON observer_events
BEGIN SELECT RAISE(ABORT, 'observer events are append-only'); END;

CREATE TRIGGER observe_input_accepted AFTER INSERT ON inputs
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, 'input.accepted',
            json_object('input_id', NEW.id, 'event_id', NEW.event_id, 'source_kind', NEW.source_kind,
                        'conversation', NEW.conversation, 'author', NEW.author,
                        'text', (SELECT json_extract(content, '$.text') FROM events WHERE id = NEW.event_id)),
            NEW.received_at);
END;

CREATE TRIGGER observe_local_receipt AFTER INSERT ON local_deliveries
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, 'delivery.receipt',
            json_object('channel', 'local', 'state', NEW.status, 'reason', NEW.reason, 'event_id', NEW.event_id,
                        'execution_id', NEW.execution_id,
                        'text', (SELECT json_extract(content, '$.text') FROM events WHERE id = NEW.event_id)),
            NEW.created_at);
END;

-- A Discord receipt: an effect settled (or held at once). An observer
-- command's effect carries the idempotency key o<command id>: its receipt
-- carries the command's causal depth.
CREATE VIEW observer_discord_receipt_data AS
SELECT o.id AS effect_id, o.session_id,
       json_object('channel', 'discord', 'kind', o.kind, 'state', o.state, 'effect_id', o.id,
                   'message_id', o.message_id, 'error', o.error, 'text', o.text,
                   'conversation', (SELECT alias FROM discord_conversations WHERE id = o.conversation_id)) AS data,
       CASE WHEN o.idempotency_key LIKE 'o%' THEN CAST(substr(o.idempotency_key, 2) AS INTEGER) END AS cause_command,
       COALESCE(o.settled_at, o.created_at) AS at
FROM discord_outbox o;

CREATE TRIGGER observe_discord_receipt AFTER UPDATE OF state ON discord_outbox
WHEN NEW.state IN ('confirmed', 'failed', 'unknown') AND OLD.state NOT IN ('confirmed', 'failed', 'unknown')
BEGIN
    INSERT INTO observer_events (session_id, kind, data, depth, cause_command, created_at)
    SELECT v.session_id, 'delivery.receipt', v.data,
           COALESCE((SELECT depth FROM observer_commands WHERE id = v.cause_command), 0), v.cause_command, v.at
    FROM observer_discord_receipt_data v WHERE v.effect_id = NEW.id;
END;

CREATE TRIGGER observe_discord_held AFTER INSERT ON discord_outbox
WHEN NEW.state IN ('confirmed', 'failed', 'unknown')
BEGIN
    INSERT INTO observer_events (session_id, kind, data, depth, cause_command, created_at)
    SELECT v.session_id, 'delivery.receipt', v.data,
           COALESCE((SELECT depth FROM observer_commands WHERE id = v.cause_command), 0), v.cause_command, v.at
    FROM observer_discord_receipt_data v WHERE v.effect_id = NEW.id;
END;

CREATE TRIGGER observe_turn_completed AFTER UPDATE OF state ON attempts
WHEN OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, 'turn.completed',
            json_object('attempt', NEW.id, 'state', NEW.state, 'outcome', NEW.outcome, 'steps', NEW.steps,
                        'tokens', NEW.tokens, 'wake_reason', NEW.wake_reason),
            COALESCE(NEW.finished_at, CAST(unixepoch('subsec') * 1000 AS INTEGER)));
END;

CREATE TRIGGER observe_revision_activated AFTER INSERT ON activations
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, 'revision.activated',
            json_object('epoch', NEW.epoch, 'release', NEW.release_id, 'kind', NEW.kind, 'reason', NEW.reason),
            NEW.activated_at);
END;

-- One row per (session, observer handler) a release bound: the cursor is the
-- last observer_events.id projected into deliveries. A handler first bound
-- starts at the newest event: history is never delivered to it.
CREATE TABLE observer_bindings (
    session_id    TEXT    NOT NULL REFERENCES sessions(id),
    handler       TEXT    NOT NULL,
    release_id    TEXT    NOT NULL,
    events        TEXT    NOT NULL CHECK (json_valid(events)),
    cursor        INTEGER NOT NULL,
    state_version INTEGER NOT NULL,
    paused        TEXT    NOT NULL DEFAULT '',
    bound_at      INTEGER NOT NULL,
    PRIMARY KEY (session_id, handler)
);

CREATE TABLE observer_deliveries (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES sessions(id),
    handler     TEXT    NOT NULL,
    event_id    INTEGER NOT NULL REFERENCES observer_events(id),
    state       TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'dead')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER NOT NULL,
    error       TEXT    NOT NULL DEFAULT '',
    release_id  TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    UNIQUE (session_id, handler, event_id)
);
CREATE INDEX observer_deliveries_due ON observer_deliveries(session_id, handler, state, id);
CREATE TRIGGER observer_deliveries_settle_once BEFORE UPDATE OF state ON observer_deliveries
WHEN OLD.state <> 'pending'
BEGIN SELECT RAISE(ABORT, 'an observer delivery settles once'); END;

-- Commands an observer proposed, committed with its acknowledgement. Each
-- is carried out once (its receipt and its done state commit together).
CREATE TABLE observer_commands (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES sessions(id),
    delivery_id INTEGER NOT NULL REFERENCES observer_deliveries(id),
    position    INTEGER NOT NULL,
    handler     TEXT    NOT NULL,
    cause_event INTEGER NOT NULL REFERENCES observer_events(id),
    depth       INTEGER NOT NULL,
    op          TEXT    NOT NULL CHECK (op IN ('local.send', 'discord.send', 'discord.react', 'discord.mark', 'runtime.wakeup')),
    args        TEXT    NOT NULL CHECK (json_valid(args)),
    state       TEXT    NOT NULL DEFAULT 'proposed' CHECK (state IN ('proposed', 'done', 'refused')),
    result      TEXT    CHECK (result IS NULL OR json_valid(result)),
    effect_id   INTEGER REFERENCES discord_outbox(id),
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    UNIQUE (delivery_id, position)
);
CREATE INDEX observer_commands_open ON observer_commands(state, id);
CREATE INDEX observer_commands_by_session ON observer_commands(session_id, created_at);
CREATE INDEX observer_commands_by_effect ON observer_commands(effect_id) WHERE effect_id IS NOT NULL;
CREATE TRIGGER observer_commands_settle_once BEFORE UPDATE OF state ON observer_commands
WHEN OLD.state <> 'proposed'
BEGIN SELECT RAISE(ABORT, 'an observer command is carried out once'); END;

-- Hook state, namespaced per handler, bounded, with its schema version;
-- written only with an acknowledgement.
CREATE TABLE hook_state (
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    namespace  TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    state      TEXT    NOT NULL CHECK (json_valid(state) AND length(state) <= 65536),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, namespace)
);
