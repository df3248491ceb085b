package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Answer is evidence that an attempt answered an input: a send its cells
// made (a local send answers the operator's conversation, a Discord effect
// the conversation it went to), or an attention decision the model made on
// an input's item.
type Answer struct {
	Step         int64  // the model step whose cell made the send; 0 for a decision
	Conversation string // a send's conversation key: "operator" or ConversationKey(channel)
	Input        int64  // a decision's input
	At           time.Time
}

// AttemptAnswerList lists the answers made while attempt ran.
func (s *Store) AttemptAnswerList(ctx context.Context, attempt int64) ([]Answer, error) {
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT m.id, 'operator', 0, d.created_at FROM local_deliveries d JOIN executions x ON x.id = d.execution_id
			JOIN model_steps m ON m.id = x.step_id WHERE m.attempt_id = ?1
		UNION ALL
		SELECT m.id, 'discord:' || c.channel_id, 0, o.created_at FROM discord_outbox o JOIN executions x ON x.id = o.execution_id
			JOIN model_steps m ON m.id = x.step_id JOIN discord_conversations c ON c.id = o.conversation_id WHERE m.attempt_id = ?1
		UNION ALL
		SELECT 0, '', i.input_id, d.at FROM attention_decisions d JOIN attention_items i ON i.id = d.item_id
			JOIN attempts a ON a.id = ?1
			WHERE i.session_id = a.session_id AND d.origin = 'model' AND d.at >= a.started_at`, attempt)
	if err != nil {
		return nil, fmt.Errorf("attempt answers: %w", err)
	}
	defer rows.Close()
	var out []Answer
	for rows.Next() {
		var a Answer
		var at int64
		if err := rows.Scan(&a.Step, &a.Conversation, &a.Input, &at); err != nil {
			return nil, fmt.Errorf("attempt answers: %w", err)
		}
		a.At = time.UnixMilli(at)
		out = append(out, a)
	}
	return out, rows.Err()
}

// InputHandle is how the model knows an input: its id, source, conversation
// and, for Discord, the conversation's alias and the message id.
type InputHandle struct {
	ID           int64
	SourceKind   string
	Conversation string
	Author       string
	Alias        string // Discord: d1, d2, …
	Kind         string // Discord: dm, channel, thread
	MessageID    string
}

// InputHandles returns the handles of inputs ids, in id order.
func (s *Store) InputHandles(ctx context.Context, ids []int64) ([]InputHandle, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT i.id, i.source_kind, i.conversation, i.author,
		COALESCE(c.alias, ''), COALESCE(c.kind, ''), COALESCE(ai.message_id, '')
		FROM inputs i LEFT JOIN attention_items ai ON ai.input_id = i.id
		LEFT JOIN discord_conversations c ON c.id = ai.conversation_id
		WHERE i.id IN (?`+strings.Repeat(",?", len(ids)-1)+`) ORDER BY i.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("input handles: %w", err)
	}
	defer rows.Close()
	var out []InputHandle
	for rows.Next() {
		var h InputHandle
		if err := rows.Scan(&h.ID, &h.SourceKind, &h.Conversation, &h.Author, &h.Alias, &h.Kind, &h.MessageID); err != nil {
			return nil, fmt.Errorf("input handles: %w", err)
		}
		out = append(out, h)
	}
	return out, rows.Err()
}
