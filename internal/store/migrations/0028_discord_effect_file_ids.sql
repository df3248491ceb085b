-- compat: readable-by-previous
-- The Discord attachment id of each file a confirmed send carried, from the
-- message Discord made ('' until then, and for a send confirmed by evidence
-- other than Discord's answer). An older binary never reads the column.
ALTER TABLE discord_effect_files ADD COLUMN attachment_id TEXT NOT NULL DEFAULT '' CHECK (length(attachment_id) <= 20);
