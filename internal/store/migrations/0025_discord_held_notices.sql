-- compat: readable-by-previous
-- The operator's notice of a held send: when [discord] operator_user_id is
-- set and notify_held = true, klbr-discord DMs the operator once per held
-- effect (with Release and Drop buttons) and records the outcome here:
-- 'sent' (message_id is the DM's message) or 'failed' (error says why; not
-- retried: klbr-core held still lists the effect). No row means no notice
-- was sent yet. An older binary never reads this table.
CREATE TABLE discord_held_notices (
    effect_id  INTEGER PRIMARY KEY REFERENCES discord_outbox(id),
    state      TEXT    NOT NULL CHECK (state IN ('sent', 'failed')),
    message_id TEXT    NOT NULL DEFAULT '' CHECK (length(message_id) <= 32),
    error      TEXT    NOT NULL DEFAULT '' CHECK (length(error) <= 2048),
    at         INTEGER NOT NULL
);
