-- 0008: lossless history. Originals (events, context_items) never change.
-- A summary covers an ordered, contiguous run of the active context's
-- entries (context items or earlier summaries); the host stores that
-- coverage, the model writes only the text. context_entries is the active
-- context: every item of an epoch is represented there exactly once,
-- directly or through one summary ancestor. The triggers below refuse what
-- would break that: covering anything twice, dropping an entry no summary
-- covers, or a summary whose range holds an entry it does not cover.

-- Bumped by each compaction commit: a compaction made against an older
-- version is discarded and retried against the current one.
ALTER TABLE sessions ADD COLUMN context_version INTEGER NOT NULL DEFAULT 0;

-- Where an item came from, for restricted readers: 'operator', 'agent' (the
-- session's own work: scratchpad, cells, notices) or 'discord:<conversation>'.
DROP TRIGGER context_items_append_only;
ALTER TABLE context_items ADD COLUMN scope TEXT NOT NULL DEFAULT 'agent';
UPDATE context_items SET scope = (
    SELECT CASE i.source_kind WHEN 'operator' THEN 'operator' ELSE 'discord:' || i.conversation END
    FROM inputs i WHERE i.event_id = context_items.event_id)
WHERE role = 'input';
CREATE TRIGGER context_items_append_only BEFORE UPDATE ON context_items
BEGIN SELECT RAISE(ABORT, 'context items are append-only'); END;
CREATE TRIGGER context_items_keep BEFORE DELETE ON context_items
BEGIN SELECT RAISE(ABORT, 'context items are append-only'); END;

CREATE TABLE summaries (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES sessions(id),
    context_epoch   INTEGER NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('normal', 'degraded')),
    text            TEXT    NOT NULL CHECK (length(text) > 0),
    route           TEXT    NOT NULL DEFAULT '',
    model           TEXT    NOT NULL DEFAULT '',
    source_tokens   INTEGER NOT NULL, -- estimated size of what it replaces
    summary_tokens  INTEGER NOT NULL, -- estimated size of its own entry
    context_version INTEGER NOT NULL, -- the version it was made against
    scopes          TEXT    NOT NULL CHECK (json_valid(scopes)),
    first_item      INTEGER NOT NULL, -- the context items it covers, through
    last_item       INTEGER NOT NULL, -- its descendants: [first_item, last_item]
    items           INTEGER NOT NULL CHECK (items > 0),
    depth           INTEGER NOT NULL CHECK (depth >= 1),
    attempts        INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    CHECK (first_item <= last_item)
);
CREATE INDEX summaries_by_session ON summaries(session_id, context_epoch, id);
CREATE TRIGGER summaries_immutable BEFORE UPDATE ON summaries
BEGIN SELECT RAISE(ABORT, 'summaries are immutable'); END;
CREATE TRIGGER summaries_keep BEFORE DELETE ON summaries
BEGIN SELECT RAISE(ABORT, 'summaries are immutable'); END;

-- A summary's ordered coverage. Each item and each summary is covered at
-- most once, ever (the unique indexes).
CREATE TABLE summary_children (
    summary_id       INTEGER NOT NULL REFERENCES summaries(id),
    position         INTEGER NOT NULL,
    item_id          INTEGER REFERENCES context_items(id),
    child_summary_id INTEGER REFERENCES summaries(id),
    CHECK ((item_id IS NULL) <> (child_summary_id IS NULL)),
    PRIMARY KEY (summary_id, position)
);
CREATE UNIQUE INDEX summary_children_item ON summary_children(item_id) WHERE item_id IS NOT NULL;
CREATE UNIQUE INDEX summary_children_summary ON summary_children(child_summary_id) WHERE child_summary_id IS NOT NULL;
CREATE TRIGGER summary_children_immutable BEFORE UPDATE ON summary_children
BEGIN SELECT RAISE(ABORT, 'summary coverage is immutable'); END;
CREATE TRIGGER summary_children_keep BEFORE DELETE ON summary_children
BEGIN SELECT RAISE(ABORT, 'summary coverage is immutable'); END;

-- The active context of each epoch, in order: position is the first context
-- item an entry represents (its own id, or a summary's first_item).
CREATE TABLE context_entries (
    session_id    TEXT    NOT NULL,
    context_epoch INTEGER NOT NULL,
    position      INTEGER NOT NULL,
    item_id       INTEGER REFERENCES context_items(id),
    summary_id    INTEGER REFERENCES summaries(id),
    CHECK ((item_id IS NULL) <> (summary_id IS NULL)),
    PRIMARY KEY (session_id, context_epoch, position)
) WITHOUT ROWID;
INSERT INTO context_entries (session_id, context_epoch, position, item_id)
    SELECT session_id, context_epoch, id, id FROM context_items;

-- An entry leaves the active context only for the summary that covers it.
CREATE TRIGGER context_entries_covered BEFORE DELETE ON context_entries
WHEN NOT EXISTS (SELECT 1 FROM summary_children
                 WHERE (OLD.item_id IS NOT NULL AND item_id = OLD.item_id)
                    OR (OLD.summary_id IS NOT NULL AND child_summary_id = OLD.summary_id))
BEGIN SELECT RAISE(ABORT, 'an active context entry can only be replaced by a summary that covers it'); END;
CREATE TRIGGER context_entries_fixed BEFORE UPDATE ON context_entries
BEGIN SELECT RAISE(ABORT, 'active context entries are replaced, never changed'); END;
-- A summary enters once, uncovered, and its range holds no other entry.
CREATE TRIGGER context_entries_summary BEFORE INSERT ON context_entries
WHEN NEW.summary_id IS NOT NULL AND (
       EXISTS (SELECT 1 FROM summary_children WHERE child_summary_id = NEW.summary_id)
    OR EXISTS (SELECT 1 FROM context_entries c, summaries s
               WHERE s.id = NEW.summary_id AND c.session_id = NEW.session_id AND c.context_epoch = NEW.context_epoch
                 AND c.position BETWEEN s.first_item AND s.last_item))
BEGIN SELECT RAISE(ABORT, 'a summary must replace the whole contiguous run it covers'); END;
CREATE TRIGGER context_entries_item BEFORE INSERT ON context_entries
WHEN NEW.item_id IS NOT NULL AND EXISTS (SELECT 1 FROM summary_children WHERE item_id = NEW.item_id)
BEGIN SELECT RAISE(ABORT, 'a covered item cannot return to the active context'); END;

-- Artifacts: immutable content under <data>/artifacts, by hash, with the
-- record that produced it.
CREATE TABLE artifacts (
    sha256     TEXT    PRIMARY KEY CHECK (length(sha256) = 64),
    size       INTEGER NOT NULL,
    media_type TEXT    NOT NULL,
    event_id   INTEGER REFERENCES events(id), -- the first record that produced it
    retention  TEXT    NOT NULL DEFAULT 'retained' CHECK (retention IN ('retained', 'purged')),
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO artifacts (sha256, size, media_type, event_id, created_at)
    SELECT json_extract(content, '$.output.artifact.sha256'), json_extract(content, '$.output.artifact.size'),
           'text/plain; charset=utf-8', id, received_at
    FROM events WHERE kind = 'cell.finished' AND json_extract(content, '$.output.artifact.sha256') IS NOT NULL;

-- The estimate the host made of each request, beside the prompt tokens the
-- provider reported: the calibration of the per-route estimate.
ALTER TABLE model_steps ADD COLUMN estimated_tokens INTEGER;

-- Lexical search over the originals and the summaries: a rebuildable
-- projection (rowid: the event id; a summary's is minus its id). meta holds
-- scope tokens (session, lane, conversation) so that scoped searches use
-- the index.
-- Reads of one record by its event (search hits, describe) find its lane.
CREATE INDEX session_items_by_event ON session_items(event_id);

CREATE VIRTUAL TABLE history_fts USING fts5(body, meta, tokenize = 'unicode61 remove_diacritics 2');
-- The highest event id the index has looked at (records after it are not
-- indexed yet; notices are looked at and left out).
CREATE TABLE history_index (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    through INTEGER NOT NULL
);
INSERT INTO history_index (id, through) VALUES (1, 0);
