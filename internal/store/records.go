package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Lane is the presentation lane of a session item. Lanes never merge.
type Lane string

// The lanes of DESIGN.md §4.
const (
	LaneInput      Lane = "input"
	LaneScratchpad Lane = "scratchpad"
	LaneCell       Lane = "cell"
	LaneSpeech     Lane = "speech"
	LaneNotice     Lane = "notice"
)

// Record is one durable session item with its event: what tail and the
// browser replay. Seq is the cursor.
type Record struct {
	Seq        int64           `json:"seq"`
	ID         int64           `json:"id"` // the event id
	Session    string          `json:"session"`
	Lane       Lane            `json:"lane"`
	Kind       string          `json:"kind"`
	At         time.Time       `json:"at"`
	OccurredAt time.Time       `json:"occurred_at"`
	ReceivedAt time.Time       `json:"received_at"`
	Content    json.RawMessage `json:"content"`
	// Collected is set when retention collected the original: Content is
	// then only a stub that says so.
	Collected *Collection `json:"collected,omitempty"`
}

// appendItem stores an event once and places it in the session's order.
func (t *Tx) appendItem(session, kind string, lane Lane, content string, occurred, received time.Time) (eventID, seq int64, err error) {
	res, err := t.exec(`INSERT INTO events (session_id, kind, content, occurred_at, received_at) VALUES (?, ?, ?, ?, ?)`,
		session, kind, content, occurred.UnixMilli(), received.UnixMilli())
	if err != nil {
		return 0, 0, fmt.Errorf("append event: %w", err)
	}
	eventID, _ = res.LastInsertId()
	res, err = t.exec(`INSERT INTO session_items (session_id, event_id, lane, at) VALUES (?, ?, ?, ?)`,
		session, eventID, lane, t.now.UnixMilli())
	if err != nil {
		return 0, 0, fmt.Errorf("append session item: %w", err)
	}
	seq, _ = res.LastInsertId()
	t.s.kickIndexer()
	t.touch(session)
	return eventID, seq, nil
}

// MaxRecordsPage bounds one read of records.
const MaxRecordsPage = 1000

// Records returns up to limit records of session with seq > since, in order.
func (s *Store) Records(ctx context.Context, session string, since int64, limit int) ([]Record, error) {
	if limit <= 0 || limit > MaxRecordsPage {
		limit = MaxRecordsPage
	}
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT si.seq, e.id, si.session_id, si.lane, e.kind, si.at, e.occurred_at, e.received_at, e.content,
			e.collected_at, e.collected_reason, e.collected_bytes
		FROM session_items si JOIN events e ON e.id = si.event_id
		WHERE si.session_id = ? AND si.seq > ?
		ORDER BY si.seq LIMIT ?`, session, since, limit)
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	defer rows.Close()
	out := make([]Record, 0, 16)
	for rows.Next() {
		var r Record
		var at, occ, rec int64
		var content, reason string
		var collected sql.NullInt64
		var bytes int64
		if err := rows.Scan(&r.Seq, &r.ID, &r.Session, &r.Lane, &r.Kind, &at, &occ, &rec, &content, &collected, &reason, &bytes); err != nil {
			return nil, fmt.Errorf("read records: %w", err)
		}
		r.At, r.OccurredAt, r.ReceivedAt = time.UnixMilli(at), time.UnixMilli(occ), time.UnixMilli(rec)
		r.Content = json.RawMessage(content)
		r.Collected = collection(collected, reason, bytes)
		out = append(out, r)
	}
	return out, rows.Err()
}

// SeqOfEvent is the seq of the record whose history ref is e<eventID> in
// session: the cursor that reads the records after it. ErrUnknownRef when
// the session holds no such record.
func (s *Store) SeqOfEvent(ctx context.Context, session string, eventID int64) (int64, error) {
	var seq int64
	err := s.rdb.QueryRowContext(ctx, `SELECT seq FROM session_items WHERE event_id = ? AND session_id = ?`, eventID, session).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: session %s has no record %s", ErrUnknownRef, session, EventRef(eventID))
	}
	if err != nil {
		return 0, fmt.Errorf("seq of %s: %w", EventRef(eventID), err)
	}
	return seq, nil
}

// LastSeq is the seq of the session's last record, 0 if it has none: the furthest
// cursor a client can hold (one index lookup).
func (s *Store) LastSeq(ctx context.Context, session string) (int64, error) {
	var seq int64
	err := s.rdb.QueryRowContext(ctx, `SELECT seq FROM session_items WHERE session_id = ? ORDER BY seq DESC LIMIT 1`, session).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last seq: %w", err)
	}
	return seq, nil
}

// TailCursor returns the cursor from which Records reads the last n records
// of session, and how many records come before it (0, 0 when the session
// has n records or fewer).
func (s *Store) TailCursor(ctx context.Context, session string, n int) (cursor, earlier int64, err error) {
	err = s.rdb.QueryRowContext(ctx, `SELECT seq FROM session_items WHERE session_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?`,
		session, n).Scan(&cursor)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("tail cursor: %w", err)
	}
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM session_items WHERE session_id = ? AND seq <= ?`,
		session, cursor).Scan(&earlier); err != nil {
		return 0, 0, fmt.Errorf("tail cursor: %w", err)
	}
	return cursor, earlier, nil
}
