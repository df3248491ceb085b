-- 0005: explicit local sends and their receipts. A send is identified by the
-- cell's execution and request id, so a retried request returns its receipt
-- instead of speaking twice; the same text sent twice is two sends.
CREATE TABLE local_deliveries (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    execution_id INTEGER NOT NULL REFERENCES executions(id),
    request_id   INTEGER NOT NULL,
    event_id     INTEGER NOT NULL REFERENCES events(id),
    status       TEXT    NOT NULL CHECK (status IN ('confirmed', 'held')),
    reason       TEXT    NOT NULL,
    epoch        INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (execution_id, request_id)
);
