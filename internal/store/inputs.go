package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// NewInput is an input to admit. Validation of sizes, encoding and authority
// happens before it reaches the store (package admission); the schema
// enforces what it can again.
type NewInput struct {
	Session      string
	SourceKind   string
	SourceKey    string
	Conversation string
	Author       string
	// Directed is true for an input that demands attention: any operator
	// input, a Discord DM or mention.
	Directed   bool
	OccurredAt time.Time
	ReceivedAt time.Time
	Body       string
	// Maintenance marks an operator input as a maintenance goal: the turn
	// attending it carries the maintenance skill.
	Maintenance bool
}

// Admitted identifies a committed input. For a duplicate source key it is the
// original input's identity and Duplicate is true.
type Admitted struct {
	InputID   int64 `json:"id"`
	EventID   int64 `json:"event_id"`
	Duplicate bool  `json:"duplicate"`
}

// inputContent is the stored original of an input event: the body and the
// source identity, kept once in events.
type inputContent struct {
	Text         string `json:"text"`
	SourceKind   string `json:"source_kind"`
	SourceKey    string `json:"source_key"`
	Conversation string `json:"conversation"`
	Author       string `json:"author"`
	Maintenance  bool   `json:"maintenance,omitempty"`
}

// AdmitInput stores the input's event, its session item, its canonical
// identity and its pending inbox row, or finds the input already admitted
// under the same source key in the session.
func (t *Tx) AdmitInput(in NewInput) (Admitted, error) {
	var a Admitted
	err := t.queryRow(`SELECT id, event_id FROM inputs WHERE session_id = ? AND source_key = ?`, in.Session, in.SourceKey).
		Scan(&a.InputID, &a.EventID)
	if err == nil {
		a.Duplicate = true
		return a, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("admit: look up source key: %w", err)
	}
	// A stopped or paused session still admits: the input is kept until
	// the operator starts it (nothing is refused that could be answered later).
	if _, err := t.sessionState(in.Session); err != nil {
		return a, err
	}
	content, err := json.Marshal(inputContent{
		Text: in.Body, SourceKind: in.SourceKind, SourceKey: in.SourceKey,
		Conversation: in.Conversation, Author: in.Author, Maintenance: in.Maintenance,
	})
	if err != nil {
		return a, fmt.Errorf("admit: %w", err)
	}
	a.EventID, _, err = t.appendItem(in.Session, in.SourceKind+".input", LaneInput, string(content), in.OccurredAt, in.ReceivedAt)
	if err != nil {
		return a, fmt.Errorf("admit: %w", err)
	}
	res, err := t.exec(`INSERT INTO inputs (session_id, event_id, source_kind, source_key, conversation, author, directed, occurred_at, received_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		in.Session, a.EventID, in.SourceKind, in.SourceKey, in.Conversation, in.Author, in.Directed,
		in.OccurredAt.UnixMilli(), in.ReceivedAt.UnixMilli())
	if err != nil {
		return a, fmt.Errorf("admit: insert input: %w", err)
	}
	a.InputID, _ = res.LastInsertId() // the inputs_enqueue trigger made its pending inbox row
	t.controlled(in.Session)
	return a, nil
}

// PendingStat is the backlog of one session and source kind.
type PendingStat struct {
	Session    string
	SourceKind string
	Count      int64
	Oldest     time.Time // received-at of the oldest pending input
}

// PendingStats reports pending inbox work by session and source kind.
func (s *Store) PendingStats(ctx context.Context) ([]PendingStat, error) {
	// O(1) in the backlog: the count is inbox_backlog's (kept by triggers in
	// the transactions that change it), the oldest one seek in
	// inbox_pending_oldest.
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT k.session_id, k.source_kind, k.pending,
			(SELECT min(b.received_at) FROM inbox b INDEXED BY inbox_pending_oldest
				WHERE b.session_id = k.session_id AND b.source_kind = k.source_kind AND b.state = 'pending')
		FROM inbox_backlog k WHERE k.pending > 0 ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("pending stats: %w", err)
	}
	defer rows.Close()
	var out []PendingStat
	for rows.Next() {
		var p PendingStat
		var oldest int64
		if err := rows.Scan(&p.Session, &p.SourceKind, &p.Count, &oldest); err != nil {
			return nil, fmt.Errorf("pending stats: %w", err)
		}
		p.Oldest = time.UnixMilli(oldest)
		out = append(out, p)
	}
	return out, rows.Err()
}
