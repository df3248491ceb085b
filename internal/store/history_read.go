package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// ErrUnknownRef reports a history reference that names nothing.
var ErrUnknownRef = errors.New("no such history reference")

// A history reference: e<event id> (a record), s<summary id>, or
// a<sha256> (an artifact).
var refPattern = regexp.MustCompile(`^(?:e([1-9][0-9]{0,18})|s([1-9][0-9]{0,18})|a([0-9a-f]{64}))$`)

// ParsedRef is a parsed history reference.
type ParsedRef struct {
	Event, Summary int64
	Artifact       string
}

// ParseRef parses a history reference.
func ParseRef(ref string) (ParsedRef, error) {
	m := refPattern.FindStringSubmatch(ref)
	if m == nil {
		return ParsedRef{}, fmt.Errorf("%w: %q (references look like e123, s12 or a<sha256>)", ErrUnknownRef, ref)
	}
	var p ParsedRef
	switch {
	case m[1] != "":
		p.Event, _ = strconv.ParseInt(m[1], 10, 64)
	case m[2] != "":
		p.Summary, _ = strconv.ParseInt(m[2], 10, 64)
	default:
		p.Artifact = m[3]
	}
	return p, nil
}

// Described is what history.describe says of a reference.
type Described struct {
	Ref     string    `json:"ref"`
	Type    string    `json:"type"` // record, summary, artifact
	Session string    `json:"session,omitempty"`
	Kind    string    `json:"kind"`
	Lane    string    `json:"lane,omitempty"`
	At      time.Time `json:"at"`
	Size    int64     `json:"size"` // bytes of its original text
	// A record's place in a context epoch, and the summary that covers it
	// (empty while it is in the active context as itself).
	Epoch     *int64 `json:"context_epoch,omitempty"`
	CoveredBy string `json:"covered_by,omitempty"`
	// Collected is set when retention collected the record's original
	// (its content is gone; CoveredBy is the summary that stands for it).
	Collected *Collection `json:"collected,omitempty"`
	// A summary's coverage.
	Summary *Summary `json:"summary,omitempty"`
	// An artifact's.
	MediaType string   `json:"media_type,omitempty"`
	Producer  string   `json:"producer,omitempty"`
	Retention string   `json:"retention,omitempty"`
	Scopes    []string `json:"scopes,omitempty"`
}

// Describe describes a reference.
func (s *Store) Describe(ctx context.Context, ref string) (Described, error) {
	p, err := ParseRef(ref)
	if err != nil {
		return Described{}, err
	}
	d := Described{Ref: ref}
	switch {
	case p.Event != 0:
		var at int64
		var size int64
		var epoch sql.NullInt64
		var cover sql.NullInt64
		var scope sql.NullString
		var collected sql.NullInt64
		var reason string
		var collectedBytes int64
		err := s.rdb.QueryRowContext(ctx, `SELECT e.session_id, e.kind, i.lane, e.received_at, length(CAST(e.content AS BLOB)),
				c.context_epoch, c.scope, (SELECT summary_id FROM summary_children WHERE item_id = c.id),
				e.collected_at, e.collected_reason, e.collected_bytes
			FROM events e JOIN session_items i ON i.event_id = e.id
			LEFT JOIN context_items c ON c.event_id = e.id WHERE e.id = ?`, p.Event).Scan(&d.Session, &d.Kind, &d.Lane, &at, &size, &epoch, &scope, &cover,
			&collected, &reason, &collectedBytes)
		if errors.Is(err, sql.ErrNoRows) {
			return d, fmt.Errorf("%w: %s", ErrUnknownRef, ref)
		}
		if err != nil {
			return d, fmt.Errorf("describe %s: %w", ref, err)
		}
		d.Type, d.At, d.Size = "record", time.UnixMilli(at), size
		if d.Collected = collection(collected, reason, collectedBytes); d.Collected != nil {
			d.Size = 0 // nothing of the original is left to read
		}
		if epoch.Valid {
			d.Epoch = &epoch.Int64
			d.Scopes = []string{scope.String}
		}
		if cover.Valid {
			d.CoveredBy = SummaryRef(cover.Int64)
		}
	case p.Summary != 0:
		sum, err := readSummary(ctx, s.rdb, p.Summary)
		if err != nil {
			return d, err
		}
		d.Type, d.Session, d.Kind, d.At, d.Size, d.Summary, d.Scopes = "summary", sum.Session, "summary."+sum.Kind, sum.CreatedAt, int64(len(sum.Text)), &sum, sum.Scopes
		var cover sql.NullInt64
		_ = s.rdb.QueryRowContext(ctx, `SELECT summary_id FROM summary_children WHERE child_summary_id = ?`, p.Summary).Scan(&cover)
		if cover.Valid {
			d.CoveredBy = SummaryRef(cover.Int64)
		}
	default:
		var at int64
		var ev sql.NullInt64
		err := s.rdb.QueryRowContext(ctx, `SELECT size, media_type, event_id, retention, created_at FROM artifacts WHERE sha256 = ?`, p.Artifact).
			Scan(&d.Size, &d.MediaType, &ev, &d.Retention, &at)
		if errors.Is(err, sql.ErrNoRows) {
			return d, fmt.Errorf("%w: %s", ErrUnknownRef, ref)
		}
		if err != nil {
			return d, fmt.Errorf("describe %s: %w", ref, err)
		}
		d.Type, d.Kind, d.At = "artifact", "artifact", time.UnixMilli(at)
		if ev.Valid {
			d.Producer = EventRef(ev.Int64)
			_ = s.rdb.QueryRowContext(ctx, `SELECT session_id FROM events WHERE id = ?`, ev.Int64).Scan(&d.Session)
		}
	}
	return d, nil
}

// Original is a record's or summary's exact stored text.
type Original struct {
	Described
	// Content is the record's original content (JSON, as stored); a
	// summary's text. Artifacts are read by the caller from their file.
	Content json.RawMessage `json:"content,omitempty"`
	Text    string          `json:"text"`
}

// Original reads a record or a summary whole (callers bound what they
// return).
func (s *Store) Original(ctx context.Context, ref string) (Original, error) {
	d, err := s.Describe(ctx, ref)
	if err != nil {
		return Original{}, err
	}
	o := Original{Described: d}
	p, _ := ParseRef(ref)
	switch {
	case p.Event != 0:
		var content string
		if err := s.rdb.QueryRowContext(ctx, `SELECT content FROM events WHERE id = ?`, p.Event).Scan(&content); err != nil {
			return o, fmt.Errorf("read %s: %w", ref, err)
		}
		o.Content = json.RawMessage(content)
		o.Text = principalText(d.Kind, content)
		if d.Collected != nil {
			o.Text = d.Collected.Text()
			if d.CoveredBy != "" {
				o.Text += "; " + d.CoveredBy + " is the summary that covers it"
			}
		}
	case p.Summary != 0:
		o.Text = d.Summary.Text
	}
	return o, nil
}

// principalText is the main text of a record: what was said, thought, run
// or shown, exactly as stored.
func principalText(kind, content string) string {
	var m map[string]any
	if json.Unmarshal([]byte(content), &m) != nil {
		return content
	}
	for _, k := range []string{"text", "code", "message"} {
		if s, ok := m[k].(string); ok && s != "" {
			return s
		}
	}
	return content
}

// Child is one entry a summary covers.
type Child struct {
	Ref  string    `json:"ref"`
	Kind string    `json:"kind"`
	At   time.Time `json:"at"`
}

// Children lists what summary covers, in order: records (e…) and earlier
// summaries (s…).
func (s *Store) Children(ctx context.Context, ref string) ([]Child, error) {
	p, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if p.Summary == 0 {
		return nil, fmt.Errorf("children: %s is not a summary (only summaries have children)", ref)
	}
	if _, err := readSummary(ctx, s.rdb, p.Summary); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT COALESCE(c.event_id, 0), COALESCE(e.kind, ''), COALESCE(e.received_at, 0),
			COALESCE(k.child_summary_id, 0), COALESCE(m.kind, ''), COALESCE(m.created_at, 0)
		FROM summary_children k
		LEFT JOIN context_items c ON c.id = k.item_id LEFT JOIN events e ON e.id = c.event_id
		LEFT JOIN summaries m ON m.id = k.child_summary_id
		WHERE k.summary_id = ? ORDER BY k.position`, p.Summary)
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", ref, err)
	}
	defer rows.Close()
	out := []Child{}
	for rows.Next() {
		var ev, sum, at, sat int64
		var kind, skind string
		if err := rows.Scan(&ev, &kind, &at, &sum, &skind, &sat); err != nil {
			return nil, err
		}
		if sum != 0 {
			out = append(out, Child{Ref: SummaryRef(sum), Kind: "summary." + skind, At: time.UnixMilli(sat)})
		} else {
			out = append(out, Child{Ref: EventRef(ev), Kind: kind, At: time.UnixMilli(at)})
		}
	}
	return out, rows.Err()
}

// recordArtifact notes an artifact a record produced (the first record
// that did, if the same content comes again). Content garbage collection
// removed that a record produces again is stored again (the artifact store
// wrote it back): its record is retained once more and its tombstone goes.
func (t *Tx) recordArtifact(sha string, size int64, mediaType string, eventID int64) error {
	res, err := t.exec(`UPDATE artifacts SET retention = 'retained', event_id = ?, created_at = ? WHERE sha256 = ? AND retention = 'purged'`,
		eventID, t.now.UnixMilli(), sha)
	if err != nil {
		return fmt.Errorf("record artifact: %w", err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		if _, err := t.exec(`DELETE FROM tombstones WHERE kind = 'artifact' AND ref = ?`, sha); err != nil {
			return fmt.Errorf("record artifact: %w", err)
		}
		return nil
	}
	_, err = t.exec(`INSERT INTO artifacts (sha256, size, media_type, event_id, created_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (sha256) DO NOTHING`, sha, size, mediaType, eventID, t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("record artifact: %w", err)
	}
	return nil
}

// ConversationChannel resolves a conversation as the model names it (an
// alias, d1) or its channel id to the canonical channel id.
func (s *Store) ConversationChannel(ctx context.Context, name string) (string, error) {
	var id string
	err := s.rdb.QueryRowContext(ctx, `SELECT channel_id FROM discord_conversations WHERE alias = ? OR channel_id = ?`, name, name).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("no conversation %q", name)
	}
	return id, err
}
