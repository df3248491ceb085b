-- 0007: Discord. Conversations carry durable short aliases (d1, d2, …) over
-- their canonical channel ids; directed messages (DMs, mentions) become
-- attention items with an explicit decision and its origin; sends and
-- reactions are outbox effects with an idempotency key, a stable nonce and an
-- honest outcome.

-- A Discord channel, thread or DM the agent has seen or spoken in. Its alias
-- is 'd' || id and is never reused (AUTOINCREMENT).
CREATE TABLE discord_conversations (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    alias           TEXT    NOT NULL UNIQUE,
    kind            TEXT    NOT NULL CHECK (kind IN ('dm', 'channel', 'thread')),
    guild_id        TEXT    NOT NULL DEFAULT '',
    channel_id      TEXT    NOT NULL UNIQUE CHECK (length(channel_id) BETWEEN 1 AND 32),
    parent_id       TEXT    NOT NULL DEFAULT '',
    name            TEXT    NOT NULL DEFAULT '',
    -- The newest message id known in the channel (admitted or sent by us):
    -- a send whose anchor is older attaches a reply reference.
    last_message_id TEXT    NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    CHECK (alias = 'd' || id)
);
CREATE TRIGGER discord_conversations_identity BEFORE UPDATE OF alias, channel_id, kind ON discord_conversations
BEGIN SELECT RAISE(ABORT, 'a conversation keeps its alias and channel'); END;

-- The Discord side of an admitted input: which message it is, where, and how
-- it reached the agent. Attachments are metadata only (bytes are fetched later).
CREATE TABLE discord_messages (
    input_id        INTEGER PRIMARY KEY REFERENCES inputs(id),
    message_id      TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 32),
    conversation_id INTEGER NOT NULL REFERENCES discord_conversations(id),
    author_id       TEXT    NOT NULL,
    mode            TEXT    NOT NULL CHECK (mode IN ('dm', 'mention', 'ambient', 'gap')),
    reply_to        TEXT    NOT NULL DEFAULT '',
    attachments     TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(attachments))
);
CREATE INDEX discord_messages_by_message ON discord_messages(message_id);

-- An outbox effect: a send or a reaction the transport performs.
-- pending → attempting → confirmed | failed | unknown; attempting may return
-- to pending only for a retry the transport was told is safe (a rate limit).
CREATE TABLE discord_outbox (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    kind            TEXT    NOT NULL CHECK (kind IN ('send', 'react')),
    conversation_id INTEGER NOT NULL REFERENCES discord_conversations(id),
    idempotency_key TEXT    NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    nonce           TEXT    NOT NULL UNIQUE CHECK (length(nonce) BETWEEN 1 AND 25),
    state           TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'attempting', 'confirmed', 'failed', 'unknown')),
    text            TEXT    NOT NULL DEFAULT '',
    emoji           TEXT    NOT NULL DEFAULT '',
    -- send: the reserved reply anchor (the message it answers); react: the message.
    target_message_id TEXT  NOT NULL DEFAULT '',
    item_id         INTEGER REFERENCES attention_items(id),
    execution_id    INTEGER REFERENCES executions(id),
    frame_id        INTEGER REFERENCES attention_frames(id),
    epoch           INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    -- the outcome: the Discord message id of a confirmed send, or why it failed / is unknown
    message_id      TEXT    NOT NULL DEFAULT '',
    reply_reference INTEGER NOT NULL DEFAULT 0 CHECK (reply_reference IN (0, 1)),
    error_code      TEXT    NOT NULL DEFAULT '',
    error           TEXT    NOT NULL DEFAULT '',
    evidence        TEXT    NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    claimed_at      INTEGER,
    settled_at      INTEGER,
    CHECK ((state IN ('confirmed', 'failed', 'unknown')) = (settled_at IS NOT NULL))
);
CREATE INDEX discord_outbox_by_state ON discord_outbox(state, id);
CREATE TRIGGER discord_outbox_transitions BEFORE UPDATE OF state ON discord_outbox
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'pending'    AND NEW.state IN ('attempting', 'failed'))
    OR (OLD.state = 'attempting' AND NEW.state IN ('pending', 'confirmed', 'failed', 'unknown'))
    -- evidence found later settles an unknown effect
    OR (OLD.state = 'unknown'    AND NEW.state = 'confirmed')
)
BEGIN SELECT RAISE(ABORT, 'illegal outbox transition'); END;

-- A DM or mention demands attention. Ambient messages are not items.
-- pending → seen → acted | ignored; acted and ignored reopen to pending only
-- by an explicit reopen. decision_origin says what evidence moved it.
CREATE TABLE attention_items (
    id              INTEGER PRIMARY KEY,
    input_id        INTEGER NOT NULL UNIQUE REFERENCES inputs(id),
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    conversation_id INTEGER NOT NULL REFERENCES discord_conversations(id),
    message_id      TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'seen', 'acted', 'ignored')),
    decision_origin TEXT    NOT NULL DEFAULT '' CHECK (decision_origin IN ('', 'model', 'delivery', 'aging', 'operator')),
    note            TEXT    NOT NULL DEFAULT '',
    -- the reply anchor: free, reserved by one effect, or consumed by a confirmed send
    anchor_effect   INTEGER REFERENCES discord_outbox(id),
    anchor_consumed INTEGER NOT NULL DEFAULT 0 CHECK (anchor_consumed IN (0, 1)),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX attention_items_pending ON attention_items(session_id, status, id);
CREATE TRIGGER attention_items_transitions BEFORE UPDATE OF status ON attention_items
WHEN NEW.status <> OLD.status AND NOT (
       (OLD.status = 'pending' AND NEW.status IN ('seen', 'acted', 'ignored'))
    OR (OLD.status = 'seen'    AND NEW.status IN ('acted', 'ignored', 'pending'))
    OR (OLD.status IN ('acted', 'ignored') AND NEW.status = 'pending' AND NEW.decision_origin IN ('model', 'operator'))
)
BEGIN SELECT RAISE(ABORT, 'illegal attention transition'); END;

-- Every decision on an item, in order: the evidence history of its status.
CREATE TABLE attention_decisions (
    id          INTEGER PRIMARY KEY,
    item_id     INTEGER NOT NULL REFERENCES attention_items(id),
    from_status TEXT    NOT NULL,
    to_status   TEXT    NOT NULL,
    origin      TEXT    NOT NULL CHECK (origin IN ('model', 'delivery', 'aging', 'operator')),
    note        TEXT    NOT NULL DEFAULT '',
    effect_id   INTEGER REFERENCES discord_outbox(id),
    at          INTEGER NOT NULL
);
CREATE TRIGGER attention_decisions_append_only BEFORE UPDATE ON attention_decisions
BEGIN SELECT RAISE(ABORT, 'attention decisions are append-only'); END;
