-- compat: readable-by-previous
-- The outcome of fetching a Discord attachment's bytes: 'fetched' (the
-- content is the artifact sha256) or 'failed' (error_code says why: too
-- large, timeout, expired, budget, http_NNN). One outcome per attachment,
-- final: a failure is recorded, never retried forever. No row means the
-- fetch has not ended yet. An older binary never reads this table.
CREATE TABLE discord_attachment_fetches (
    input_id      INTEGER NOT NULL REFERENCES discord_messages(input_id),
    attachment_id TEXT    NOT NULL CHECK (length(attachment_id) BETWEEN 1 AND 32),
    state         TEXT    NOT NULL CHECK (state IN ('fetched', 'failed')),
    sha256        TEXT    CHECK (sha256 IS NULL OR length(sha256) = 64),
    size          INTEGER NOT NULL DEFAULT 0,
    error_code    TEXT    NOT NULL DEFAULT '',
    detail        TEXT    NOT NULL DEFAULT '',
    at            INTEGER NOT NULL,
    PRIMARY KEY (input_id, attachment_id),
    CHECK ((state = 'fetched') = (sha256 IS NOT NULL))
) WITHOUT ROWID;
