-- compat: readable-by-previous
-- Child ends for observers, and an index for describing records: a child agent's end is also a child.completed (it succeeded) or
-- child.failed (failed, cancelled, unknown) observer event in its parent's
-- session, committed in the same transaction as the end, beside the
-- job.completed event every job's end commits (a klbr-core of the schema before
-- binds no observer to them, so it still runs on this file).
--
-- Widening observer_events' kind CHECK changes no stored row: the table
-- definition is edited in place (as 0015 does), and RESET makes this
-- connection read the edited schema at once.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''job.completed''', '''job.completed'', ''child.completed'', ''child.failed''')
WHERE type = 'table' AND name = 'observer_events';
PRAGMA writable_schema = RESET;

CREATE TRIGGER observe_child_ended AFTER UPDATE OF state ON jobs
WHEN NEW.kind = 'child' AND OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, CASE NEW.state WHEN 'succeeded' THEN 'child.completed' ELSE 'child.failed' END,
            json_object('job', NEW.id, 'child', json_extract(NEW.spec, '$.session'), 'state', NEW.state,
                        'error', NEW.error,
                        -- a result over 4 KiB stays in the record: agents.get(id) reads it
                        'result', CASE WHEN length(NEW.result) <= 4096 THEN json(NEW.result) END,
                        'result_bytes', COALESCE(length(NEW.result), 0),
                        -- the child ended its turn without agents.finish: its last text is the result
                        'implicit', json(CASE WHEN json_valid(NEW.result) AND json_type(NEW.result) = 'object'
                                               AND json_extract(NEW.result, '$.implicit') IS 1 THEN 'true' ELSE 'false' END)),
            NEW.updated_at);
END;

-- A record's scope and cover are found by its event (history.describe, and
-- every hit a child agent's search checks against its grant).
CREATE INDEX context_items_by_event ON context_items(event_id);
