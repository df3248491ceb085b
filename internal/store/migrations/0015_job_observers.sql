-- compat: readable-by-previous
-- 0015: job ends are observer events (a klbr-core of schema 14 binds no
-- observer to them, so it still runs on this file). Each run's end (a one-shot's final
-- state, or a recurring job's run that went back to pending for its next
-- deadline) commits a job.completed event in the same transaction, like an
-- attempt's turn.completed.
--
-- Widening observer_events' kind CHECK changes no stored row: the table
-- definition is edited in place (as 0013 does for inputs), and RESET makes
-- this connection read the edited schema at once.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, 'CHECK (kind IN (''input.accepted'', ''delivery.receipt'', ''turn.completed'', ''revision.activated''))',
                       'CHECK (kind IN (''input.accepted'', ''delivery.receipt'', ''turn.completed'', ''revision.activated'', ''job.completed''))')
WHERE type = 'table' AND name = 'observer_events';
PRAGMA writable_schema = RESET;

CREATE TRIGGER observe_job_completed AFTER UPDATE OF state ON jobs
WHEN OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO observer_events (session_id, kind, data, created_at)
    VALUES (NEW.session_id, 'job.completed',
            json_object('job', NEW.id, 'kind', NEW.kind, 'state', NEW.state, 'run', NEW.runs,
                        'recovery', NEW.recovery, 'error', NEW.error,
                        -- a result over 4 KiB stays in the record: jobs.get(id) reads it
                        'result', CASE WHEN length(NEW.result) <= 4096 THEN json(NEW.result) END,
                        'result_bytes', COALESCE(length(NEW.result), 0),
                        'output_artifact', NEW.output_artifact, 'output_bytes', NEW.output_bytes,
                        'output_preview', substr(NEW.output_preview, -1000),
                        'next_due', NEW.next_due),
            NEW.updated_at);
END;
