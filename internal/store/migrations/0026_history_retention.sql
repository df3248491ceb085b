-- compat: readable-by-previous
-- 0025: retention of history originals ([retention] history_days). An
-- original a normal summary covers may have its content collected: the
-- event row stays (its id, kind, times, session item, context items and
-- the summaries' coverage of it), its content becomes a stub that says so,
-- and collected_at / collected_reason / collected_bytes record when, why
-- and how much. A binary of the schema before ignores the columns and reads
-- the stub as the record's JSON; it never collects.
ALTER TABLE events ADD COLUMN collected_at INTEGER; -- unix ms; NULL: the original is held
ALTER TABLE events ADD COLUMN collected_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN collected_bytes INTEGER NOT NULL DEFAULT 0; -- the original content's size

-- Events stay append-only but for one change, once: the collection of an
-- original whose every context item a normal summary covers directly (a
-- degraded stub is no summary of what it covers, and a record that was
-- never in a context has no summary at all). Nothing else of the row moves.
DROP TRIGGER events_append_only_update;
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
WHEN NOT (
        OLD.collected_at IS NULL AND NEW.collected_at IS NOT NULL AND length(NEW.collected_reason) > 0
    AND NEW.id = OLD.id AND NEW.session_id = OLD.session_id AND NEW.kind = OLD.kind
    AND NEW.occurred_at = OLD.occurred_at AND NEW.received_at = OLD.received_at
    AND NEW.collected_bytes = length(CAST(OLD.content AS BLOB))
    AND NEW.content = json_object('collected', json_object('at', NEW.collected_at, 'reason', NEW.collected_reason))
    AND EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = OLD.id)
    AND NOT EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = OLD.id
                    AND NOT EXISTS (SELECT 1 FROM summary_children k JOIN summaries s ON s.id = k.summary_id
                                    WHERE k.item_id = c.id AND s.kind = 'normal')))
BEGIN SELECT RAISE(ABORT, 'events are append-only: only an original a normal summary covers may be collected, once'); END;
