package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Retention of history originals ([retention] history_days, migration
// 0026). An original is collected only when a normal summary covers every
// context item it has (what the agent has a summary of), it is older than
// the cutoff, and no running child's grant names it; its row, ids, place
// and coverage stay, its content becomes a stub, and the search index
// forgets it.

// Collection says that a record's original content was collected, when
// and why. Readers show it instead of the content.
type Collection struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	Bytes  int64     `json:"bytes"` // the size of the content collected
}

// Text is how a reader shows a collected record: never as empty text.
func (c *Collection) Text() string {
	return fmt.Sprintf("collected by retention on %s: %s", c.At.UTC().Format(time.DateOnly), c.Reason)
}

// collection builds a Collection from an event's columns (nil while the
// original is held).
func collection(at sql.NullInt64, reason string, bytes int64) *Collection {
	if !at.Valid {
		return nil
	}
	return &Collection{At: time.UnixMilli(at.Int64), Reason: reason, Bytes: bytes}
}

// CollectableEvent is an original retention may collect.
type CollectableEvent struct {
	ID      int64
	Session string
	Bytes   int64
}

// HistoryPins are the originals a running child's grant needs: named
// exactly (e…), through a summary (s…), or by a scope of its parent's
// history (scope:…).
type HistoryPins struct {
	Events map[int64]string             // event → why
	Scopes map[string]map[string]string // session → scope → why
}

// pinned says why e stays, or "".
func (p HistoryPins) pinned(id int64, session string, scopes []string) string {
	if why := p.Events[id]; why != "" {
		return why
	}
	for _, sc := range scopes {
		if why := p.Scopes[session][sc]; why != "" {
			return why
		}
	}
	return ""
}

// HistoryPinsNow reads what running (or pending) children were granted.
func (s *Store) HistoryPinsNow(ctx context.Context) (HistoryPins, error) {
	p := HistoryPins{Events: map[int64]string{}, Scopes: map[string]map[string]string{}}
	rows, err := s.rdb.QueryContext(ctx, `SELECT j.id, j.session_id, r.value FROM jobs j, json_each(j.spec, '$.refs') r
		WHERE j.kind = 'child' AND j.state IN ('pending', 'running') AND r.type = 'text'`)
	if err != nil {
		return p, fmt.Errorf("history pins: %w", err)
	}
	type grant struct {
		job          int64
		session, ref string
	}
	var grants []grant
	for rows.Next() {
		var g grant
		if err := rows.Scan(&g.job, &g.session, &g.ref); err != nil {
			rows.Close()
			return p, fmt.Errorf("history pins: %w", err)
		}
		grants = append(grants, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("history pins: %w", err)
	}
	for _, g := range grants {
		why := fmt.Sprintf("granted to child job %d", g.job)
		if sc, ok := strings.CutPrefix(g.ref, "scope:"); ok {
			if p.Scopes[g.session] == nil {
				p.Scopes[g.session] = map[string]string{}
			}
			p.Scopes[g.session][sc] = why
			continue
		}
		ref, err := ParseRef(g.ref)
		if err != nil {
			continue // not a history ref: it pins nothing
		}
		switch {
		case ref.Event != 0:
			p.Events[ref.Event] = why
		case ref.Summary != 0:
			// Everything the summary covers, through its descendants: its
			// range of context items.
			ids, err := s.rdb.QueryContext(ctx, `SELECT c.event_id FROM summaries m JOIN context_items c
				ON c.session_id = m.session_id AND c.context_epoch = m.context_epoch AND c.id BETWEEN m.first_item AND m.last_item
				WHERE m.id = ?`, ref.Summary)
			if err != nil {
				return p, fmt.Errorf("history pins: %w", err)
			}
			for ids.Next() {
				var id int64
				if err := ids.Scan(&id); err != nil {
					ids.Close()
					return p, fmt.Errorf("history pins: %w", err)
				}
				p.Events[id] = why + " (through " + g.ref + ")"
			}
			ids.Close()
			if err := ids.Err(); err != nil {
				return p, fmt.Errorf("history pins: %w", err)
			}
		}
	}
	return p, nil
}

// HistoryCutoffID is the highest event id received before cutoff: the
// originals retention may look at are at or below it (one scan, on a
// reader).
func (s *Store) HistoryCutoffID(ctx context.Context, cutoff time.Time) (int64, error) {
	var id sql.NullInt64
	if err := s.rdb.QueryRowContext(ctx, `SELECT max(id) FROM events WHERE received_at < ?`, cutoff.UnixMilli()).Scan(&id); err != nil {
		return 0, fmt.Errorf("history cutoff: %w", err)
	}
	return id.Int64, nil
}

// CollectableEvents lists up to limit originals with ids in (after,
// through], received before cutoff, not yet collected, that a normal
// summary covers wholly and pins do not hold. It also returns the highest
// id it looked at (the next call's after), 0 when nothing is left.
func (s *Store) CollectableEvents(ctx context.Context, after, through int64, cutoff time.Time, pins HistoryPins, limit int) ([]CollectableEvent, int64, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT e.id, e.session_id, length(CAST(e.content AS BLOB)),
			(SELECT group_concat(c.scope, char(31)) FROM context_items c WHERE c.event_id = e.id)
		FROM events e
		WHERE e.id > ?1 AND e.id <= ?2 AND e.received_at < ?3 AND e.collected_at IS NULL
		  AND EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = e.id)
		  AND NOT EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = e.id
		                  AND NOT EXISTS (SELECT 1 FROM summary_children k JOIN summaries m ON m.id = k.summary_id
		                                  WHERE k.item_id = c.id AND m.kind = 'normal'))
		ORDER BY e.id LIMIT ?4`, after, through, cutoff.UnixMilli(), limit)
	if err != nil {
		return nil, 0, fmt.Errorf("collectable history: %w", err)
	}
	defer rows.Close()
	var out []CollectableEvent
	last := int64(0)
	for rows.Next() {
		var e CollectableEvent
		var scopes sql.NullString
		if err := rows.Scan(&e.ID, &e.Session, &e.Bytes, &scopes); err != nil {
			return nil, 0, fmt.Errorf("collectable history: %w", err)
		}
		last = e.ID
		if pins.pinned(e.ID, e.Session, strings.Split(scopes.String, "\x1f")) != "" {
			continue
		}
		out = append(out, e)
	}
	return out, last, rows.Err()
}

// CollectEvent collects one original's content under reason: the row
// stays, its content becomes a stub that says so (migration 0026's trigger
// checks it: a reader that knows nothing of collection still shows what
// happened rather than empty text), and the search index forgets it.
// It returns the bytes of content collected, 0 if it was collected before.
// The schema refuses an original no normal summary covers wholly.
func (t *Tx) CollectEvent(id int64, reason string) (int64, error) {
	at := t.now.UnixMilli()
	res, err := t.exec(`UPDATE events SET content = json_object('collected', json_object('at', ?1, 'reason', ?2)),
			collected_at = ?1, collected_reason = ?2, collected_bytes = length(CAST(content AS BLOB))
		WHERE id = ?3 AND collected_at IS NULL`, at, reason, id)
	if err != nil {
		return 0, fmt.Errorf("collect e%d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return 0, nil
	}
	if _, err := t.exec(`DELETE FROM history_fts WHERE rowid = ?`, id); err != nil {
		return 0, fmt.Errorf("collect e%d: search index: %w", id, err)
	}
	var n int64
	if err := t.queryRow(`SELECT collected_bytes FROM events WHERE id = ?`, id).Scan(&n); err != nil {
		return 0, fmt.Errorf("collect e%d: %w", id, err)
	}
	return n, nil
}

// CollectedHistory is what retention collected of history so far.
type CollectedHistory struct {
	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"`
}

// HistoryCollected counts the collected originals.
func (s *Store) HistoryCollected(ctx context.Context) (CollectedHistory, error) {
	var c CollectedHistory
	err := s.rdb.QueryRowContext(ctx, `SELECT count(*), COALESCE(sum(collected_bytes), 0) FROM events WHERE collected_at IS NOT NULL`).Scan(&c.Records, &c.Bytes)
	if err != nil {
		return c, fmt.Errorf("collected history: %w", err)
	}
	return c, nil
}
