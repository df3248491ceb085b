-- compat: readable-by-previous
-- Held sends the operator can release: a Discord effect delivery.review did
-- not allow is 'held' (not settled, never claimed) until the operator
-- releases it (held → pending: the transport sends it like any other) or
-- drops it (held → failed, error_code 'dropped'). released_by names who
-- decided; held_reason keeps the review's reason after a release.
--
-- An older binary never makes or moves a held row and claims only pending
-- ones, so it still runs on this file. Widening the state CHECK changes no
-- stored row: the table definition is edited in place (as 0015 does).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, 'CHECK (state IN (''pending'', ''attempting'', ''confirmed'', ''failed'', ''unknown''))',
                       'CHECK (state IN (''pending'', ''attempting'', ''confirmed'', ''failed'', ''unknown'', ''held''))')
WHERE type = 'table' AND name = 'discord_outbox';
PRAGMA writable_schema = RESET;

ALTER TABLE discord_outbox ADD COLUMN released_by TEXT NOT NULL DEFAULT '';
ALTER TABLE discord_outbox ADD COLUMN held_reason TEXT NOT NULL DEFAULT '';

DROP TRIGGER discord_outbox_transitions;
CREATE TRIGGER discord_outbox_transitions BEFORE UPDATE OF state ON discord_outbox
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'pending'    AND NEW.state IN ('attempting', 'failed'))
    OR (OLD.state = 'attempting' AND NEW.state IN ('pending', 'confirmed', 'failed', 'unknown'))
    -- evidence found later settles an unknown effect
    OR (OLD.state = 'unknown'    AND NEW.state = 'confirmed')
    -- the operator releases (once) or drops a held effect
    OR (OLD.state = 'held'       AND NEW.state IN ('pending', 'failed'))
)
BEGIN SELECT RAISE(ABORT, 'illegal outbox transition'); END;

-- A held effect's receipt (state held) is still a delivery.receipt event for
-- observers, as it was when held effects were recorded failed.
DROP TRIGGER observe_discord_held;
CREATE TRIGGER observe_discord_held AFTER INSERT ON discord_outbox
WHEN NEW.state IN ('confirmed', 'failed', 'unknown', 'held')
BEGIN
    INSERT INTO observer_events (session_id, kind, data, depth, cause_command, created_at)
    SELECT v.session_id, 'delivery.receipt', v.data,
           COALESCE((SELECT depth FROM observer_commands WHERE id = v.cause_command), 0), v.cause_command, v.at
    FROM observer_discord_receipt_data v WHERE v.effect_id = NEW.id;
END;
