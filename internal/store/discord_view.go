package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// ConversationMessage is one line of a conversation as the operator reads
// it: a message klbr admitted there (In) or an effect it performed there
// (a send or a reaction, with its receipt).
type ConversationMessage struct {
	At time.Time `json:"at"`
	// In: an admitted message.
	InputID   int64           `json:"input_id,omitempty"`
	Author    string          `json:"author,omitempty"`
	Mode      string          `json:"mode,omitempty"` // dm, mention (directed) or ambient
	MessageID string          `json:"message_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"` // the input event's content (its text)
	// Collected is set when retention collected the message's original.
	Collected *Collection `json:"collected,omitempty"`
	ItemID    int64       `json:"item_id,omitempty"`
	// Out: an effect.
	EffectID       int64  `json:"effect_id,omitempty"`
	Kind           string `json:"kind,omitempty"`  // send, react
	State          string `json:"state,omitempty"` // pending, attempting, confirmed, failed, unknown
	Text           string `json:"text,omitempty"`
	Emoji          string `json:"emoji,omitempty"`
	ReplyReference bool   `json:"reply_reference,omitempty"`
	ErrorCode      string `json:"error_code,omitempty"`
	Error          string `json:"error,omitempty"`
	Evidence       string `json:"evidence,omitempty"`
}

// MaxConversationPage bounds one read of a conversation.
const MaxConversationPage = 500

// ConversationLog returns the newest limit messages and effects of the
// conversation ref (an alias or key), oldest first.
func (s *Store) ConversationLog(ctx context.Context, ref string, limit int) (Conversation, []ConversationMessage, error) {
	c, err := s.ConversationByRef(ctx, ref)
	if err != nil {
		return c, nil, err
	}
	limit = min(max(limit, 1), MaxConversationPage)
	rows, err := s.rdb.QueryContext(ctx, `SELECT * FROM (
		SELECT i.received_at AS at, 0 AS out, i.id, i.author, m.mode, m.message_id, e.content, coalesce(a.id, 0),
			0, '', '', '', '', 0, '', '', '', e.collected_at, e.collected_reason, e.collected_bytes
		FROM discord_messages m JOIN inputs i ON i.id = m.input_id JOIN events e ON e.id = i.event_id
		LEFT JOIN attention_items a ON a.input_id = m.input_id
		WHERE m.conversation_id = ? AND m.mode <> 'gap'
		UNION ALL
		SELECT o.created_at, 1, 0, '', '', o.message_id, '', 0,
			o.id, o.kind, o.state, o.text, o.emoji, o.reply_reference, o.error_code, o.error, o.evidence, NULL, '', 0
		FROM discord_outbox o WHERE o.conversation_id = ?
		ORDER BY 1 DESC, 2 DESC, 3 DESC, 9 DESC LIMIT ?) ORDER BY 1, 2, 3, 9`, c.ID, c.ID, limit)
	if err != nil {
		return c, nil, fmt.Errorf("conversation log: %w", err)
	}
	defer rows.Close()
	var out []ConversationMessage
	for rows.Next() {
		var m ConversationMessage
		var at, isOut, reply int64
		var content, reason string
		var collected sql.NullInt64
		var collectedBytes int64
		if err := rows.Scan(&at, &isOut, &m.InputID, &m.Author, &m.Mode, &m.MessageID, &content, &m.ItemID,
			&m.EffectID, &m.Kind, &m.State, &m.Text, &m.Emoji, &reply, &m.ErrorCode, &m.Error, &m.Evidence,
			&collected, &reason, &collectedBytes); err != nil {
			return c, nil, fmt.Errorf("conversation log: %w", err)
		}
		m.At = time.UnixMilli(at)
		m.ReplyReference = reply == 1
		if isOut == 0 {
			m.Content = json.RawMessage(content)
			m.Collected = collection(collected, reason, collectedBytes)
		}
		out = append(out, m)
	}
	return c, out, rows.Err()
}

// ConversationCount is how many messages klbr admitted in a conversation
// and the newest one's input id: a reader's unread count is the messages
// after the last one it saw.
type ConversationCount struct {
	Messages  int64 `json:"messages"`
	LastInput int64 `json:"last_input_id"`
}

// ConversationCounts returns the counts by conversation alias.
func (s *Store) ConversationCounts(ctx context.Context) (map[string]ConversationCount, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT c.alias, count(*), max(m.input_id) FROM discord_messages m
		JOIN discord_conversations c ON c.id = m.conversation_id WHERE m.mode <> 'gap' GROUP BY c.alias`)
	if err != nil {
		return nil, fmt.Errorf("conversation counts: %w", err)
	}
	defer rows.Close()
	out := map[string]ConversationCount{}
	for rows.Next() {
		var alias string
		var c ConversationCount
		if err := rows.Scan(&alias, &c.Messages, &c.LastInput); err != nil {
			return nil, fmt.Errorf("conversation counts: %w", err)
		}
		out[alias] = c
	}
	return out, rows.Err()
}
