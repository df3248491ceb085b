-- compat: readable-by-previous
-- 0017: the backlog costs O(1) to read, however many inputs wait. status,
-- session reads, /metrics and the turn loop's glance read a count kept per
-- session and source kind by triggers, in the same transaction as the
-- admission (an inbox row inserted pending) and the claim, release or
-- consumption (its state leaving or re-entering pending) that change it; the
-- oldest pending input of each is one seek in a partial index. The triggers
-- live in the file, so a klbr-core of schema 16 running on it keeps the
-- count as well (it reads its backlog by its own scans).

-- What the backlog is read by, copied from the input: fixed for the row's life.
ALTER TABLE inbox ADD COLUMN source_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE inbox ADD COLUMN received_at INTEGER NOT NULL DEFAULT 0;
UPDATE inbox SET (source_kind, received_at) = (SELECT i.source_kind, i.received_at FROM inputs i WHERE i.id = inbox.input_id);
CREATE TRIGGER inbox_fixed BEFORE UPDATE OF input_id, session_id, source_kind, received_at ON inbox
BEGIN SELECT RAISE(ABORT, 'an inbox row''s input, session, source kind and receipt time are fixed'); END;

DROP TRIGGER inputs_enqueue;
CREATE TRIGGER inputs_enqueue AFTER INSERT ON inputs
BEGIN
    INSERT INTO inbox (input_id, session_id, state, updated_at, source_kind, received_at)
    VALUES (NEW.id, NEW.session_id, 'pending', NEW.received_at, NEW.source_kind, NEW.received_at);
END;

CREATE INDEX inbox_pending_oldest ON inbox(session_id, source_kind, received_at) WHERE state = 'pending';

-- Pending inbox rows by session and source kind.
CREATE TABLE inbox_backlog (
    session_id  TEXT    NOT NULL,
    source_kind TEXT    NOT NULL,
    pending     INTEGER NOT NULL CHECK (pending >= 0),
    PRIMARY KEY (session_id, source_kind)
) WITHOUT ROWID;
INSERT INTO inbox_backlog (session_id, source_kind, pending)
SELECT session_id, source_kind, count(*) FROM inbox WHERE state = 'pending' GROUP BY session_id, source_kind;

CREATE TRIGGER inbox_backlog_admit AFTER INSERT ON inbox WHEN NEW.state = 'pending'
BEGIN
    INSERT INTO inbox_backlog (session_id, source_kind, pending) VALUES (NEW.session_id, NEW.source_kind, 1)
    ON CONFLICT (session_id, source_kind) DO UPDATE SET pending = pending + 1;
END;
CREATE TRIGGER inbox_backlog_leave AFTER UPDATE OF state ON inbox WHEN OLD.state = 'pending' AND NEW.state <> 'pending'
BEGIN
    UPDATE inbox_backlog SET pending = pending - 1 WHERE session_id = OLD.session_id AND source_kind = OLD.source_kind;
END;
CREATE TRIGGER inbox_backlog_return AFTER UPDATE OF state ON inbox WHEN OLD.state <> 'pending' AND NEW.state = 'pending'
BEGIN
    INSERT INTO inbox_backlog (session_id, source_kind, pending) VALUES (NEW.session_id, NEW.source_kind, 1)
    ON CONFLICT (session_id, source_kind) DO UPDATE SET pending = pending + 1;
END;
CREATE TRIGGER inbox_backlog_delete AFTER DELETE ON inbox WHEN OLD.state = 'pending'
BEGIN
    UPDATE inbox_backlog SET pending = pending - 1 WHERE session_id = OLD.session_id AND source_kind = OLD.source_kind;
END;
