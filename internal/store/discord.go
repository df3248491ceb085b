package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Discord: conversations with durable aliases, the Discord side of admitted
// inputs, attention items and their decisions, and the outbox of sends and
// reactions (migration 0007).

// Errors callers branch on.
var (
	ErrUnknownConversation = errors.New("unknown conversation")
	ErrUnknownItem         = errors.New("unknown attention item")
	ErrUnknownEffect       = errors.New("unknown outbox effect")
	ErrItemElsewhere       = errors.New("the attention item belongs to another conversation")
	ErrAttentionMove       = errors.New("illegal attention transition")
	ErrOutboxMove          = errors.New("illegal outbox transition")
)

// ConversationKey is the canonical conversation string of a Discord channel,
// as inputs and routing handles carry it.
func ConversationKey(channelID string) string { return "discord:" + channelID }

// ChannelOfKey is the inverse of ConversationKey.
func ChannelOfKey(key string) (string, bool) {
	return strings.CutPrefix(key, "discord:")
}

// Conversation is a Discord channel, thread or DM with its durable alias.
type Conversation struct {
	ID            int64  `json:"-"`
	Alias         string `json:"alias"` // d1, d2, …: a display alias, never a routing identity by spelling
	Key           string `json:"key"`   // discord:<channel id>
	Kind          string `json:"kind"`  // dm, channel, thread
	GuildID       string `json:"guild_id,omitempty"`
	ChannelID     string `json:"channel_id"`
	ParentID      string `json:"parent_id,omitempty"`
	Name          string `json:"name,omitempty"`
	LastMessageID string `json:"last_message_id,omitempty"`
	// LastInboundID is the newest message admitted from the conversation
	// (never one of ours): what klbr-discord reads history after when it
	// starts.
	LastInboundID string `json:"last_inbound_id,omitempty"`
	Pending       int64  `json:"pending"` // attention items pending or seen
}

// DiscordMessage is the Discord side of an input admitted in the same
// transaction.
type DiscordMessage struct {
	Session     string
	MessageID   string
	ChannelID   string
	ChannelKind string // dm, channel, thread
	GuildID     string
	ParentID    string
	ChannelName string
	AuthorID    string
	Mode        string // dm, mention, ambient, gap
	// OutOfOrder: older messages of the channel may not be admitted yet;
	// the message does not move the backfill cursor (last_inbound_id).
	OutOfOrder  bool
	ReplyTo     string
	Attachments json.RawMessage // metadata only; nil means none
}

// DiscordAdmitted is what admission of a Discord message recorded.
type DiscordAdmitted struct {
	Conversation string `json:"conversation"` // alias
	ItemID       int64  `json:"item_id,omitempty"`
}

// RecordDiscordMessage records the Discord side of the input a: its
// conversation (created with the next alias if new), its message row and,
// for a DM or mention, a pending attention item. A duplicate input records
// nothing and answers what the first admission recorded.
func (t *Tx) RecordDiscordMessage(a Admitted, m DiscordMessage) (DiscordAdmitted, error) {
	var out DiscordAdmitted
	if a.Duplicate {
		var item sql.NullInt64
		var conv int64
		err := t.queryRow(`SELECT c.id, c.alias, a.id FROM discord_messages m
			JOIN discord_conversations c ON c.id = m.conversation_id
			LEFT JOIN attention_items a ON a.input_id = m.input_id
			WHERE m.input_id = ?`, a.InputID).Scan(&conv, &out.Conversation, &item)
		if errors.Is(err, sql.ErrNoRows) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("discord message: %w", err)
		}
		out.ItemID = item.Int64
		// A catch-up reading a message admitted live (out of order) puts it
		// in order now.
		if m.Mode != "gap" && !m.OutOfOrder {
			if err := t.advance(conv, m.MessageID, true, true); err != nil {
				return out, err
			}
		}
		return out, nil
	}
	conv, err := t.ensureConversation(m.ChannelID, m.ChannelKind, m.GuildID, m.ParentID, m.ChannelName)
	if err != nil {
		return out, err
	}
	out.Conversation = conv.Alias
	att := string(m.Attachments)
	if att == "" {
		att = "[]"
	}
	if _, err := t.exec(`INSERT INTO discord_messages (input_id, message_id, conversation_id, author_id, mode, reply_to, attachments)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, a.InputID, m.MessageID, conv.ID, m.AuthorID, m.Mode, m.ReplyTo, att); err != nil {
		return out, fmt.Errorf("discord message: %w", err)
	}
	if m.Mode != "gap" {
		if err := t.advance(conv.ID, m.MessageID, true, !m.OutOfOrder); err != nil {
			return out, err
		}
	}
	if m.Mode == "dm" || m.Mode == "mention" {
		res, err := t.exec(`INSERT INTO attention_items (input_id, session_id, conversation_id, message_id, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?)`, a.InputID, m.Session, conv.ID, m.MessageID, t.now.UnixMilli(), t.now.UnixMilli())
		if err != nil {
			return out, fmt.Errorf("attention item: %w", err)
		}
		out.ItemID, _ = res.LastInsertId()
	}
	return out, nil
}

// ensureConversation finds the conversation of channelID or creates it with
// the next alias. A known conversation's name is refreshed.
func (t *Tx) ensureConversation(channelID, kind, guildID, parentID, name string) (Conversation, error) {
	c, err := t.conversationWhere(`c.channel_id = ?`, channelID)
	if err == nil {
		if name != "" && name != c.Name {
			if _, err := t.exec(`UPDATE discord_conversations SET name = ? WHERE id = ?`, name, c.ID); err != nil {
				return c, fmt.Errorf("conversation: %w", err)
			}
			c.Name = name
		}
		return c, nil
	}
	if !errors.Is(err, ErrUnknownConversation) {
		return c, err
	}
	switch kind {
	case "dm", "channel", "thread":
	default:
		return c, fmt.Errorf("conversation %s: kind %q is not dm, channel or thread", channelID, kind)
	}
	// The alias is 'd' || id: the id AUTOINCREMENT assigns next.
	var next int64
	if err := t.queryRow(`SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'discord_conversations'), 0) + 1`).Scan(&next); err != nil {
		return c, fmt.Errorf("conversation: next alias: %w", err)
	}
	alias := fmt.Sprintf("d%d", next)
	res, err := t.exec(`INSERT INTO discord_conversations (id, alias, kind, guild_id, channel_id, parent_id, name, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, next, alias, kind, guildID, channelID, parentID, name, t.now.UnixMilli())
	if err != nil {
		return c, fmt.Errorf("conversation: %w", err)
	}
	c.ID, _ = res.LastInsertId()
	c.Alias, c.Key, c.Kind, c.GuildID, c.ChannelID, c.ParentID, c.Name = alias, ConversationKey(channelID), kind, guildID, channelID, parentID, name
	return c, nil
}

// advance records messageID as the conversation's newest message when it
// is newer and, for a message admitted from the conversation (inbound, not
// one of our sends), as its newest inbound one: the backfill's cursor. An
// inbound message admitted out of order (not inOrder) starts a cursor the
// conversation lacks, and moves none: without a cursor the backfill reads
// nothing, so older messages are no more lost with it, and newer ones are
// read.
func (t *Tx) advance(conv int64, messageID string, inbound, inOrder bool) error {
	var last, lastIn string
	if err := t.queryRow(`SELECT last_message_id, last_inbound_id FROM discord_conversations WHERE id = ?`, conv).Scan(&last, &lastIn); err != nil {
		return fmt.Errorf("conversation: %w", err)
	}
	newer := SnowflakeLess(last, messageID)
	newerIn := inbound && (inOrder && SnowflakeLess(lastIn, messageID) || lastIn == "")
	if !newer && !newerIn {
		return nil
	}
	if newer {
		last = messageID
	}
	if newerIn {
		lastIn = messageID
	}
	if _, err := t.exec(`UPDATE discord_conversations SET last_message_id = ?, last_inbound_id = ? WHERE id = ?`, last, lastIn, conv); err != nil {
		return fmt.Errorf("conversation: %w", err)
	}
	return nil
}

// SnowflakeLess orders Discord ids (decimal strings without leading zeros)
// numerically; "" is before everything.
func SnowflakeLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

const conversationSelect = `SELECT c.id, c.alias, c.kind, c.guild_id, c.channel_id, c.parent_id, c.name, c.last_message_id, c.last_inbound_id,
	(SELECT count(*) FROM attention_items a WHERE a.conversation_id = c.id AND a.status IN ('pending', 'seen'))
	FROM discord_conversations c`

func scanConversation(row rowScanner) (Conversation, error) {
	var c Conversation
	err := row.Scan(&c.ID, &c.Alias, &c.Kind, &c.GuildID, &c.ChannelID, &c.ParentID, &c.Name, &c.LastMessageID, &c.LastInboundID, &c.Pending)
	c.Key = ConversationKey(c.ChannelID)
	return c, err
}

func (t *Tx) conversationWhere(cond string, arg any) (Conversation, error) {
	c, err := scanConversation(t.queryRow(conversationSelect+` WHERE `+cond, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %v", ErrUnknownConversation, arg)
	}
	if err != nil {
		return c, fmt.Errorf("conversation: %w", err)
	}
	return c, nil
}

// ConversationByRef resolves an alias (d3) or a canonical key
// (discord:<channel id>) to its conversation.
func (t *Tx) ConversationByRef(ref string) (Conversation, error) {
	if ch, ok := ChannelOfKey(ref); ok {
		return t.conversationWhere(`c.channel_id = ?`, ch)
	}
	return t.conversationWhere(`c.alias = ?`, ref)
}

// ConversationByRef resolves an alias or canonical key (a read).
func (s *Store) ConversationByRef(ctx context.Context, ref string) (Conversation, error) {
	cond, arg := `c.alias = ?`, ref
	if ch, ok := ChannelOfKey(ref); ok {
		cond, arg = `c.channel_id = ?`, ch
	}
	c, err := scanConversation(s.rdb.QueryRowContext(ctx, conversationSelect+` WHERE `+cond, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", ErrUnknownConversation, ref)
	}
	if err != nil {
		return c, fmt.Errorf("conversation: %w", err)
	}
	return c, nil
}

// Conversations lists every known conversation, by alias number.
func (s *Store) Conversations(ctx context.Context) ([]Conversation, error) {
	rows, err := s.rdb.QueryContext(ctx, conversationSelect+` ORDER BY c.id`)
	if err != nil {
		return nil, fmt.Errorf("conversations: %w", err)
	}
	defer rows.Close()
	var out []Conversation
	for rows.Next() {
		c, err := scanConversation(rows)
		if err != nil {
			return nil, fmt.Errorf("conversations: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// -- attention ------------------------------------------------------------------

// Attention statuses and decision origins.
const (
	ItemPending = "pending"
	ItemSeen    = "seen"
	ItemActed   = "acted"
	ItemIgnored = "ignored"

	OriginModel    = "model"
	OriginDelivery = "delivery"
	OriginAging    = "aging"
	OriginOperator = "operator"
)

// AttentionItem is a DM or mention and the decision on it.
type AttentionItem struct {
	ID             int64     `json:"id"`
	InputID        int64     `json:"input_id"`
	Session        string    `json:"session"`
	Conversation   string    `json:"conversation"` // alias
	MessageID      string    `json:"message_id"`
	Status         string    `json:"status"`
	DecisionOrigin string    `json:"decision_origin,omitempty"`
	Note           string    `json:"note,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Attachments are the message's attachments (metadata).
	Attachments []Attachment `json:"attachments,omitempty"`
}

const itemSelect = `SELECT a.id, a.input_id, a.session_id, c.alias, a.message_id, a.status, a.decision_origin, a.note, a.created_at, a.updated_at,
	a.conversation_id, COALESCE((SELECT ` + attachmentsExpr + ` FROM discord_messages m WHERE m.input_id = a.input_id), '[]')
	FROM attention_items a JOIN discord_conversations c ON c.id = a.conversation_id`

func scanItem(row rowScanner) (AttentionItem, int64, error) {
	var it AttentionItem
	var created, updated, conv int64
	var att string
	err := row.Scan(&it.ID, &it.InputID, &it.Session, &it.Conversation, &it.MessageID, &it.Status, &it.DecisionOrigin, &it.Note,
		&created, &updated, &conv, &att)
	it.Attachments = parseAttachments(att)
	it.CreatedAt, it.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return it, conv, err
}

// Mark moves an attention item to status, recording origin and note. The
// reopen of an acted or ignored item is the explicit move to pending. When
// conversation is non-zero, the item must belong to it. Marking an item with
// the status it has is a no-op.
func (t *Tx) Mark(itemID int64, status, origin, note string, conversation int64) (AttentionItem, error) {
	it, conv, err := scanItem(t.queryRow(itemSelect+` WHERE a.id = ?`, itemID))
	if errors.Is(err, sql.ErrNoRows) {
		return it, fmt.Errorf("%w: %d", ErrUnknownItem, itemID)
	}
	if err != nil {
		return it, fmt.Errorf("mark: %w", err)
	}
	if conversation != 0 && conv != conversation {
		return it, fmt.Errorf("%w: item %d is in %s", ErrItemElsewhere, itemID, it.Conversation)
	}
	if !legalMark(it.Status, status, origin) {
		return it, fmt.Errorf("%w: item %d is %s; it cannot become %s by %s (reopen an acted or ignored item with status pending first)",
			ErrAttentionMove, itemID, it.Status, status, origin)
	}
	if it.Status == status {
		return it, nil
	}
	return it, t.moveItem(it, status, origin, note, 0)
}

func legalMark(from, to, origin string) bool {
	switch origin {
	case OriginModel, OriginDelivery, OriginAging, OriginOperator:
	default:
		return false
	}
	switch to {
	case ItemPending, ItemSeen, ItemActed, ItemIgnored:
	default:
		return false
	}
	if from == to {
		return true
	}
	switch from {
	case ItemPending:
		return to != ItemPending
	case ItemSeen:
		return true
	default: // acted, ignored: only an explicit reopen
		return to == ItemPending && (origin == OriginModel || origin == OriginOperator)
	}
}

func (t *Tx) moveItem(it AttentionItem, to, origin, note string, effect int64) error {
	var eff any
	if effect != 0 {
		eff = effect
	}
	if _, err := t.exec(`UPDATE attention_items SET status = ?, decision_origin = ?, note = ?, updated_at = ? WHERE id = ?`,
		to, origin, note, t.now.UnixMilli(), it.ID); err != nil {
		return fmt.Errorf("mark: %w", err)
	}
	if _, err := t.exec(`INSERT INTO attention_decisions (item_id, from_status, to_status, origin, note, effect_id, at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		it.ID, it.Status, to, origin, note, eff, t.now.UnixMilli()); err != nil {
		return fmt.Errorf("mark: %w", err)
	}
	return nil
}

// AgePending ignores the pending items created before cutoff, with
// decision_origin aging: the record says time passed, not that anyone read
// them. It returns how many it moved.
func (t *Tx) AgePending(cutoff time.Time, note string) (int64, error) {
	rows, err := t.query(itemSelect+` WHERE a.status = 'pending' AND a.created_at < ? ORDER BY a.id`, cutoff.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("age: %w", err)
	}
	var items []AttentionItem
	for rows.Next() {
		it, _, err := scanItem(rows)
		if err != nil {
			rows.Close()
			return 0, fmt.Errorf("age: %w", err)
		}
		items = append(items, it)
	}
	rows.Close()
	for _, it := range items {
		if err := t.moveItem(it, ItemIgnored, OriginAging, note, 0); err != nil {
			return 0, err
		}
	}
	return int64(len(items)), nil
}

// OldestPendingItem is the creation time of the oldest pending item, if any.
func (s *Store) OldestPendingItem(ctx context.Context) (time.Time, bool, error) {
	var at sql.NullInt64
	if err := s.rdb.QueryRowContext(ctx, `SELECT min(created_at) FROM attention_items WHERE status = 'pending'`).Scan(&at); err != nil {
		return time.Time{}, false, fmt.Errorf("attention: %w", err)
	}
	return time.UnixMilli(at.Int64), at.Valid, nil
}

// AttentionItems lists a session's items, newest first, with status in
// statuses (all when empty), at most limit.
func (s *Store) AttentionItems(ctx context.Context, session string, statuses []string, limit int) ([]AttentionItem, error) {
	q := itemSelect + ` WHERE a.session_id = ?`
	args := []any{session}
	if len(statuses) > 0 {
		q += ` AND a.status IN (` + strings.TrimSuffix(strings.Repeat("?,", len(statuses)), ",") + `)`
		for _, st := range statuses {
			args = append(args, st)
		}
	}
	q += ` ORDER BY a.id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("attention items: %w", err)
	}
	defer rows.Close()
	var out []AttentionItem
	for rows.Next() {
		it, _, err := scanItem(rows)
		if err != nil {
			return nil, fmt.Errorf("attention items: %w", err)
		}
		out = append(out, it)
	}
	return out, rows.Err()
}

// AttentionItem reads one item.
func (s *Store) AttentionItem(ctx context.Context, id int64) (AttentionItem, error) {
	it, _, err := scanItem(s.rdb.QueryRowContext(ctx, itemSelect+` WHERE a.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return it, fmt.Errorf("%w: %d", ErrUnknownItem, id)
	}
	return it, err
}

// AttentionCount is the number of items in one status.
type AttentionCount struct {
	Status string
	Count  int64
}

// AttentionCounts counts items by status (for metrics).
func (s *Store) AttentionCounts(ctx context.Context) ([]AttentionCount, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT status, count(*) FROM attention_items GROUP BY status ORDER BY status`)
	if err != nil {
		return nil, fmt.Errorf("attention counts: %w", err)
	}
	defer rows.Close()
	var out []AttentionCount
	for rows.Next() {
		var c AttentionCount
		if err := rows.Scan(&c.Status, &c.Count); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// FrameRouting reads an attention frame's session and routing handles.
func (s *Store) FrameRouting(ctx context.Context, frame int64) (session string, routing json.RawMessage, err error) {
	var r string
	err = s.rdb.QueryRowContext(ctx, `SELECT session_id, routing_handles FROM attention_frames WHERE id = ?`, frame).Scan(&session, &r)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, fmt.Errorf("attention frame %d does not exist", frame)
	}
	return session, json.RawMessage(r), err
}

// FrameItem returns the newest attention item of the frame's inputs in the
// conversation that is still pending or seen (0 when there is none): the
// item a send without an explicit one answers.
func (s *Store) FrameItem(ctx context.Context, inputs []int64, conversation int64) (int64, error) {
	if len(inputs) == 0 {
		return 0, nil
	}
	args := []any{conversation}
	for _, id := range inputs {
		args = append(args, id)
	}
	var id sql.NullInt64
	err := s.rdb.QueryRowContext(ctx, `SELECT max(id) FROM attention_items WHERE conversation_id = ? AND status IN ('pending', 'seen')
		AND input_id IN (`+strings.TrimSuffix(strings.Repeat("?,", len(inputs)), ",")+`)`, args...).Scan(&id)
	return id.Int64, err
}
