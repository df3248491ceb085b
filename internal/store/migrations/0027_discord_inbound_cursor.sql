-- compat: readable-by-previous
-- 0027: the backfill cursor of a conversation. last_message_id moves with
-- our own sends too (a send's reply anchor needs it), so a message someone
-- wrote before our newest send, which the gateway delivered but klbr-discord
-- never got admitted (it was stopped with the message queued), lay behind
-- the cursor and was never read back. last_inbound_id is the newest message
-- admitted from the conversation: only admission moves it. A binary of the
-- schema before ignores the column.
ALTER TABLE discord_conversations ADD COLUMN last_inbound_id TEXT NOT NULL DEFAULT '';
UPDATE discord_conversations SET last_inbound_id = COALESCE((
    SELECT m.message_id FROM discord_messages m
    WHERE m.conversation_id = discord_conversations.id AND m.mode <> 'gap'
    ORDER BY length(m.message_id) DESC, m.message_id DESC LIMIT 1), '');
