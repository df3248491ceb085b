package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// SourceEntry is one entry of a run to summarize, with what the summarizer
// must know of it: the original, its lane, and for a cell's result the
// receipts of the sends it made (operational truth comes from records).
type SourceEntry struct {
	Ref      EntryRef
	EventRef string // e<id> of an item's record
	Role     string // input, assistant, tool, notice
	Kind     string
	Scope    string
	At       time.Time
	Content  json.RawMessage
	Author   string
	Sends    []SendReceipt
	Summary  *Summary // for an earlier summary
}

// SendReceipt is a send a cell made and what became of it.
type SendReceipt struct {
	Ref     string `json:"ref"`     // the speech record, if one was written
	Channel string `json:"channel"` // local, or discord:<conversation>
	Text    string `json:"text"`
	State   string `json:"state"` // confirmed, held, pending, attempting, failed, unknown
	Detail  string `json:"detail,omitempty"`
}

// RunSource reads the originals of a run of active entries, for the
// summarizer.
func (s *Store) RunSource(ctx context.Context, session string, refs []EntryRef) ([]SourceEntry, error) {
	out := make([]SourceEntry, 0, len(refs))
	for _, r := range refs {
		if r.Summary != 0 {
			sum, err := readSummary(ctx, s.rdb, r.Summary)
			if err != nil {
				return nil, err
			}
			out = append(out, SourceEntry{Ref: r, Summary: &sum, At: sum.CreatedAt, Kind: "summary." + sum.Kind})
			continue
		}
		e := SourceEntry{Ref: r}
		var content string
		var at, eventID int64
		if err := s.rdb.QueryRowContext(ctx, `SELECT c.event_id, c.role, e.kind, c.scope, e.received_at, e.content
			FROM context_items c JOIN events e ON e.id = c.event_id WHERE c.id = ? AND c.session_id = ?`, r.Item, session).
			Scan(&eventID, &e.Role, &e.Kind, &e.Scope, &at, &content); err != nil {
			return nil, fmt.Errorf("run source: item %d: %w", r.Item, err)
		}
		e.EventRef, e.At, e.Content = EventRef(eventID), time.UnixMilli(at), json.RawMessage(content)
		if e.Role == "tool" {
			var x struct {
				Execution int64 `json:"execution_id"`
			}
			_ = json.Unmarshal(e.Content, &x)
			if x.Execution != 0 {
				sends, err := s.sendsOf(ctx, x.Execution)
				if err != nil {
					return nil, err
				}
				e.Sends = sends
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// sendsOf lists the sends and reactions a cell made, with their current
// state, in order.
func (s *Store) sendsOf(ctx context.Context, execution int64) ([]SendReceipt, error) {
	var out []SendReceipt
	rows, err := s.rdb.QueryContext(ctx, `SELECT d.event_id, d.status, d.reason, e.content FROM local_deliveries d
		JOIN events e ON e.id = d.event_id WHERE d.execution_id = ? ORDER BY d.id`, execution)
	if err != nil {
		return nil, fmt.Errorf("sends of cell %d: %w", execution, err)
	}
	for rows.Next() {
		var ev int64
		var status, reason, content string
		if err := rows.Scan(&ev, &status, &reason, &content); err != nil {
			rows.Close()
			return nil, err
		}
		var c struct {
			Text string `json:"text"`
		}
		_ = json.Unmarshal([]byte(content), &c)
		out = append(out, SendReceipt{Ref: EventRef(ev), Channel: "local", Text: c.Text, State: status, Detail: reason})
	}
	rows.Close()
	rows, err = s.rdb.QueryContext(ctx, `SELECT o.kind, o.state, o.text, o.emoji, c.channel_id, COALESCE(c.alias, ''), o.error, o.message_id
		FROM discord_outbox o JOIN discord_conversations c ON c.id = o.conversation_id WHERE o.execution_id = ? ORDER BY o.id`, execution)
	if err != nil {
		return nil, fmt.Errorf("sends of cell %d: %w", execution, err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, state, text, emoji, channel, alias, errText, msg string
		if err := rows.Scan(&kind, &state, &text, &emoji, &channel, &alias, &errText, &msg); err != nil {
			return nil, err
		}
		r := SendReceipt{Channel: "discord:" + channel, Text: text, State: state, Detail: errText}
		if alias != "" {
			r.Channel += " (" + alias + ")"
		}
		if kind == "react" {
			r.Text = "reaction " + emoji
		}
		if msg != "" && r.Detail == "" {
			r.Detail = "message " + msg
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// InputItems lists the context items of inputs (by input id).
func (s *Store) InputItems(ctx context.Context, inputs []int64) ([]int64, error) {
	var out []int64
	for _, in := range inputs {
		rows, err := s.rdb.QueryContext(ctx, `SELECT c.id FROM inputs i JOIN context_items c ON c.event_id = i.event_id AND c.role = 'input'
			WHERE i.id = ?`, in)
		if err != nil {
			return nil, fmt.Errorf("input items: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, id)
		}
		rows.Close()
	}
	return out, nil
}

// Calibration returns route's recent requests' raw estimates beside the
// prompt tokens reported for them, oldest first.
func (s *Store) Calibration(ctx context.Context, route string, n int) (raw, reported []int, err error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT estimated_tokens, prompt_tokens FROM model_steps
		WHERE route = ? AND estimated_tokens > 0 AND prompt_tokens > 0 ORDER BY id DESC LIMIT ?`, route, n)
	if err != nil {
		return nil, nil, fmt.Errorf("calibration: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b int
		if err := rows.Scan(&a, &b); err != nil {
			return nil, nil, err
		}
		raw, reported = append([]int{a}, raw...), append([]int{b}, reported...)
	}
	return raw, reported, rows.Err()
}
