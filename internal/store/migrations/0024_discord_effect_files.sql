-- compat: readable-by-previous
-- Files a Discord send carries (c.send(text, files=[...])): each is an
-- artifact copied from the cell's workspace when the send was asked, so
-- what the review saw is what goes out. At most 10 a send, in order. An
-- older binary never reads this table (it would send the text alone).
CREATE TABLE discord_effect_files (
    effect_id    INTEGER NOT NULL REFERENCES discord_outbox(id),
    position     INTEGER NOT NULL CHECK (position BETWEEN 0 AND 9),
    filename     TEXT    NOT NULL CHECK (length(filename) BETWEEN 1 AND 255),
    content_type TEXT    NOT NULL DEFAULT '',
    sha256       TEXT    NOT NULL CHECK (length(sha256) = 64),
    size         INTEGER NOT NULL CHECK (size >= 0),
    PRIMARY KEY (effect_id, position)
) WITHOUT ROWID;
