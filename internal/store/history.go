package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The lossless history: summaries over the active context, their ordered
// coverage, and the active context itself (context_entries). Originals are
// never changed; migration 0008's triggers refuse a write that would cover
// an item twice, drop an entry no summary covers, or leave an entry inside
// a summary's range. CommitSummary checks the rest (a contiguous run of the
// current version) before it writes.

// ErrStaleContext reports a compaction made against a context version (or
// epoch) that is no longer current: discard it and plan again.
var ErrStaleContext = errors.New("the active context changed since the compaction was planned")

// Summary kinds.
const (
	SummaryNormal   = "normal"
	SummaryDegraded = "degraded" // written by the host when the summarizer could not be used
)

// Summary is a stored summary.
type Summary struct {
	ID             int64     `json:"id"`
	Session        string    `json:"session"`
	Epoch          int64     `json:"context_epoch"`
	Kind           string    `json:"kind"`
	Text           string    `json:"text"`
	Route          string    `json:"route,omitempty"`
	Model          string    `json:"model,omitempty"`
	SourceTokens   int       `json:"source_tokens"`
	SummaryTokens  int       `json:"summary_tokens"`
	ContextVersion int64     `json:"context_version"`
	Scopes         []string  `json:"scopes"`
	FirstItem      int64     `json:"first_item"`
	LastItem       int64     `json:"last_item"`
	Items          int       `json:"items"`
	Depth          int       `json:"depth"`
	Attempts       int       `json:"attempts"`
	CreatedAt      time.Time `json:"created_at"`
}

// Entry is one entry of the active context: an original item or a summary.
type Entry struct {
	Position int64 // the first context item it represents
	Item     *ContextItem
	Summary  *Summary
}

// Ref is the entry's handle in the coverage: "i<id>" for an item, "s<id>"
// for a summary.
func (e Entry) Ref() EntryRef {
	if e.Summary != nil {
		return EntryRef{Summary: e.Summary.ID}
	}
	return EntryRef{Item: e.Item.ID}
}

// EntryRef names an active context entry: an item or a summary.
type EntryRef struct {
	Item    int64
	Summary int64
}

// ActiveContext is a consistent read of a context epoch's active entries.
type ActiveContext struct {
	Epoch   int64
	Version int64
	Entries []Entry
}

// contextEntriesQuery reads the session's version and its entries in one
// statement: a row with a NULL position when there are none.
const contextEntriesQuery = `SELECT v.version, x.position, c.id, c.role, e.kind, COALESCE(c.call_id, ''), e.content,
		d.alias, d.kind, d.name, m.mode, m.message_id, a.id, x.summary_id, ` + attachmentsExpr + `, i.id,
		e.collected_at, COALESCE(e.collected_reason, ''), COALESCE(e.collected_bytes, 0)
	FROM (SELECT context_version AS version FROM sessions WHERE id = ?1) v
	LEFT JOIN context_entries x ON x.session_id = ?1 AND x.context_epoch = ?2 AND x.position > ?3
	LEFT JOIN context_items c ON c.id = x.item_id
	LEFT JOIN events e ON e.id = c.event_id
	LEFT JOIN inputs i ON c.role = 'input' AND i.event_id = c.event_id
	LEFT JOIN discord_messages m ON m.input_id = i.id
	LEFT JOIN discord_conversations d ON d.id = m.conversation_id
	LEFT JOIN attention_items a ON a.input_id = i.id
	ORDER BY x.position`

// Active reads session's active context in epoch, the entries after
// position after (0: all), with the context version they belong to, in one
// statement (one snapshot). Its cost tracks the active context, not the
// history.
func (s *Store) Active(ctx context.Context, session string, epoch, after int64) (ActiveContext, error) {
	ac := ActiveContext{Epoch: epoch, Version: -1}
	var err error
	ac.Entries, err = scanEntries(ctx, s.rdb, session, epoch, after, &ac.Version)
	if err == nil && ac.Version < 0 {
		err = fmt.Errorf("%w: %s", ErrUnknownSession, session)
	}
	return ac, err
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func scanEntries(ctx context.Context, q querier, session string, epoch, after int64, version *int64) ([]Entry, error) {
	rows, err := q.QueryContext(ctx, contextEntriesQuery, session, epoch, after)
	if err != nil {
		return nil, fmt.Errorf("active context: %w", err)
	}
	var out []Entry
	var sums []int
	for rows.Next() {
		var e Entry
		var v int64
		var pos, id, item, summary, input sql.NullInt64
		var role, kind, call, content, alias, dkind, name, mode, msg, att sql.NullString
		var collected sql.NullInt64
		var reason string
		var collectedBytes int64
		if err := rows.Scan(&v, &pos, &id, &role, &kind, &call, &content, &alias, &dkind, &name, &mode, &msg, &item, &summary, &att, &input,
			&collected, &reason, &collectedBytes); err != nil {
			rows.Close()
			return nil, fmt.Errorf("active context: %w", err)
		}
		if version != nil {
			*version = v
		}
		if !pos.Valid {
			continue // no entries after
		}
		e.Position = pos.Int64
		if summary.Valid {
			e.Summary = &Summary{ID: summary.Int64}
			sums = append(sums, len(out))
		} else {
			c := &ContextItem{ID: id.Int64, Role: role.String, Kind: kind.String, CallID: call.String, Content: json.RawMessage(content.String),
				Collected: collection(collected, reason, collectedBytes)}
			if alias.Valid {
				c.Discord = &DiscordSource{Alias: alias.String, Kind: dkind.String, Name: name.String, Mode: mode.String,
					MessageID: msg.String, Item: item.Int64, Attachments: parseAttachments(att.String), InputID: input.Int64}
			}
			e.Item = c
		}
		out = append(out, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("active context: %w", err)
	}
	for _, i := range sums {
		sum, err := readSummary(ctx, q, out[i].Summary.ID)
		if err != nil {
			return nil, err
		}
		out[i].Summary = &sum
	}
	return out, nil
}

const summaryColumns = `id, session_id, context_epoch, kind, text, route, model, source_tokens, summary_tokens,
	context_version, scopes, first_item, last_item, items, depth, attempts, created_at`

func readSummary(ctx context.Context, q querier, id int64) (Summary, error) {
	var s Summary
	var scopes string
	var created int64
	err := q.QueryRowContext(ctx, `SELECT `+summaryColumns+` FROM summaries WHERE id = ?`, id).Scan(&s.ID, &s.Session, &s.Epoch,
		&s.Kind, &s.Text, &s.Route, &s.Model, &s.SourceTokens, &s.SummaryTokens, &s.ContextVersion, &scopes, &s.FirstItem,
		&s.LastItem, &s.Items, &s.Depth, &s.Attempts, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("%w: summary s%d", ErrUnknownRef, id)
	}
	if err != nil {
		return s, fmt.Errorf("summary s%d: %w", id, err)
	}
	_ = json.Unmarshal([]byte(scopes), &s.Scopes)
	s.CreatedAt = time.UnixMilli(created)
	return s, nil
}

// NewSummary is a compaction to commit: the summary text (or the host's
// degraded stub) and the run of active entries it replaces, as planned
// against Epoch and Version.
type NewSummary struct {
	Session       string
	Epoch         int64
	Version       int64
	Covers        []EntryRef // a contiguous run of active entries, in order
	Kind          string
	Text          string
	Route, Model  string
	SourceTokens  int
	SummaryTokens int
	Attempts      int
	// Notice is the context.compacted notice's content; the summary's id and
	// range are added to it.
	Notice map[string]any
}

// CommitSummary stores a summary and replaces the run it covers in the
// active context, in one transaction, and bumps the context version. It
// refuses (ErrStaleContext) a compaction planned against another epoch or
// version, and any run that is not contiguous in the current active
// context; the triggers refuse covering anything twice.
func (t *Tx) CommitSummary(n NewSummary) (int64, error) {
	if len(n.Covers) == 0 || strings.TrimSpace(n.Text) == "" {
		return 0, errors.New("commit summary: nothing covered, or no text")
	}
	if n.Kind != SummaryNormal && n.Kind != SummaryDegraded {
		return 0, fmt.Errorf("commit summary: kind %q", n.Kind)
	}
	var epoch, version int64
	if err := t.queryRow(`SELECT context_epoch, context_version FROM sessions WHERE id = ?`, n.Session).Scan(&epoch, &version); err != nil {
		return 0, fmt.Errorf("commit summary: %w", err)
	}
	if epoch != n.Epoch || version != n.Version {
		return 0, fmt.Errorf("%w (planned against epoch %d version %d, now epoch %d version %d)", ErrStaleContext, n.Epoch, n.Version, epoch, version)
	}
	// The run, as it stands: the active entries from the first covered one
	// on, as many as it covers, must be exactly the covered ones.
	first, err := t.entryPosition(n.Session, epoch, n.Covers[0])
	if err != nil {
		return 0, err
	}
	rows, err := t.query(`SELECT position, COALESCE(item_id, 0), COALESCE(summary_id, 0) FROM context_entries
		WHERE session_id = ? AND context_epoch = ? AND position >= ? ORDER BY position LIMIT ?`, n.Session, epoch, first, len(n.Covers))
	if err != nil {
		return 0, fmt.Errorf("commit summary: %w", err)
	}
	var run []EntryRef
	var positions []int64
	for rows.Next() {
		var p int64
		var r EntryRef
		if err := rows.Scan(&p, &r.Item, &r.Summary); err != nil {
			rows.Close()
			return 0, fmt.Errorf("commit summary: %w", err)
		}
		run, positions = append(run, r), append(positions, p)
	}
	rows.Close()
	if !slices.Equal(run, n.Covers) {
		return 0, fmt.Errorf("%w: the covered entries are not a contiguous run of the active context", ErrStaleContext)
	}
	// The leaves: [first, last] through the children, and their count.
	var last int64
	items, depth := 0, 1
	scopes := map[string]bool{}
	for _, r := range run {
		if r.Summary != 0 {
			var s Summary
			var sc string
			if err := t.queryRow(`SELECT last_item, items, depth, scopes FROM summaries WHERE id = ?`, r.Summary).Scan(&s.LastItem, &s.Items, &s.Depth, &sc); err != nil {
				return 0, fmt.Errorf("commit summary: child s%d: %w", r.Summary, err)
			}
			var ss []string
			_ = json.Unmarshal([]byte(sc), &ss)
			for _, x := range ss {
				scopes[x] = true
			}
			last, items, depth = s.LastItem, items+s.Items, max(depth, s.Depth+1)
			continue
		}
		var scope string
		if err := t.queryRow(`SELECT scope FROM context_items WHERE id = ?`, r.Item).Scan(&scope); err != nil {
			return 0, fmt.Errorf("commit summary: item %d: %w", r.Item, err)
		}
		scopes[scope] = true
		last, items = r.Item, items+1
	}
	// No gap: every item of the epoch in the range is under this summary.
	var inRange int
	if err := t.queryRow(`SELECT count(*) FROM context_items WHERE session_id = ? AND context_epoch = ? AND id BETWEEN ? AND ?`,
		n.Session, epoch, first, last).Scan(&inRange); err != nil {
		return 0, fmt.Errorf("commit summary: %w", err)
	}
	if inRange != items {
		return 0, fmt.Errorf("commit summary: the run covers %d items but its range holds %d: coverage would have a gap", items, inRange)
	}
	scopeList := slices.Sorted(func(yield func(string) bool) {
		for s := range scopes {
			if !yield(s) {
				return
			}
		}
	})
	sb, _ := json.Marshal(scopeList)
	res, err := t.exec(`INSERT INTO summaries (session_id, context_epoch, kind, text, route, model, source_tokens, summary_tokens,
		context_version, scopes, first_item, last_item, items, depth, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		n.Session, epoch, n.Kind, n.Text, n.Route, n.Model, n.SourceTokens, n.SummaryTokens, version, string(sb), first, last, items, depth,
		n.Attempts, t.now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("commit summary: %w", err)
	}
	id, _ := res.LastInsertId()
	for i, r := range run {
		var item, child any
		if r.Summary != 0 {
			child = r.Summary
		} else {
			item = r.Item
		}
		if _, err := t.exec(`INSERT INTO summary_children (summary_id, position, item_id, child_summary_id) VALUES (?, ?, ?, ?)`, id, i, item, child); err != nil {
			return 0, fmt.Errorf("commit summary: coverage: %w", err)
		}
	}
	if _, err := t.exec(`DELETE FROM context_entries WHERE session_id = ? AND context_epoch = ? AND position >= ? AND position <= ?`,
		n.Session, epoch, first, positions[len(positions)-1]); err != nil {
		return 0, fmt.Errorf("commit summary: replace: %w", err)
	}
	if _, err := t.exec(`INSERT INTO context_entries (session_id, context_epoch, position, summary_id) VALUES (?, ?, ?, ?)`,
		n.Session, epoch, first, id); err != nil {
		return 0, fmt.Errorf("commit summary: replace: %w", err)
	}
	if _, err := t.exec(`UPDATE sessions SET context_version = context_version + 1 WHERE id = ?`, n.Session); err != nil {
		return 0, fmt.Errorf("commit summary: %w", err)
	}
	if err := t.indexSummary(id, n.Session, n.Text, scopeList); err != nil {
		return 0, err
	}
	notice := map[string]any{}
	for k, v := range n.Notice {
		notice[k] = v
	}
	notice["summary"] = SummaryRef(id)
	notice["kind"] = n.Kind
	notice["first_item"], notice["last_item"], notice["items"], notice["depth"] = first, last, items, depth
	notice["attempts"] = n.Attempts
	notice["text"] = n.Text
	if _, err := t.Notice(n.Session, "context.compacted", notice, false); err != nil {
		return 0, err
	}
	t.touch(n.Session)
	return id, nil
}

func (t *Tx) entryPosition(session string, epoch int64, r EntryRef) (int64, error) {
	var p int64
	var err error
	if r.Summary != 0 {
		err = t.queryRow(`SELECT position FROM context_entries WHERE session_id = ? AND context_epoch = ? AND summary_id = ?`,
			session, epoch, r.Summary).Scan(&p)
	} else {
		err = t.queryRow(`SELECT position FROM context_entries WHERE session_id = ? AND context_epoch = ? AND position = ? AND item_id = ?`,
			session, epoch, r.Item, r.Item).Scan(&p)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %+v is not in the active context", ErrStaleContext, r)
	}
	return p, err
}

// SummaryRef is a summary's reference in history: "s<id>".
func SummaryRef(id int64) string { return fmt.Sprintf("s%d", id) }

// ContextStats describes a session's active context for status.
type ContextStats struct {
	Epoch     int64 `json:"epoch"`
	Version   int64 `json:"version"`
	Entries   int64 `json:"entries"`
	Summaries int64 `json:"summaries"`
	Items     int64 `json:"items"` // originals in the epoch, covered or not (counted through the active entries: O(context), not O(history))
}

// ContextStats reads session's context stats.
func (s *Store) ContextStats(ctx context.Context, session string) (ContextStats, error) {
	var c ContextStats
	err := s.rdb.QueryRowContext(ctx, `SELECT s.context_epoch, s.context_version,
		(SELECT count(*) FROM context_entries x WHERE x.session_id = s.id AND x.context_epoch = s.context_epoch),
		(SELECT count(*) FROM context_entries x WHERE x.session_id = s.id AND x.context_epoch = s.context_epoch AND x.summary_id IS NOT NULL),
		(SELECT COALESCE(sum(CASE WHEN x.summary_id IS NULL THEN 1 ELSE m.items END), 0) FROM context_entries x
			LEFT JOIN summaries m ON m.id = x.summary_id WHERE x.session_id = s.id AND x.context_epoch = s.context_epoch)
		FROM sessions s WHERE s.id = ?`, session).Scan(&c.Epoch, &c.Version, &c.Entries, &c.Summaries, &c.Items)
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", ErrUnknownSession, session)
	}
	return c, err
}

// CheckCoverage verifies the coverage invariant of session's epoch: every
// context item is represented exactly once by the active entries, directly
// or through one summary ancestor, in order. It reads everything (for
// tests and consistency checks, not the turn loop).
func (s *Store) CheckCoverage(ctx context.Context, session string, epoch int64) error {
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var all []int64
	rows, err := tx.QueryContext(ctx, `SELECT id FROM context_items WHERE session_id = ? AND context_epoch = ? ORDER BY id`, session, epoch)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		all = append(all, id)
	}
	rows.Close()
	entries, err := scanEntries(ctx, tx, session, epoch, 0, nil)
	if err != nil {
		return err
	}
	var leaves []int64
	for _, e := range entries {
		if e.Item != nil {
			if e.Position != e.Item.ID {
				return fmt.Errorf("coverage: item %d at position %d", e.Item.ID, e.Position)
			}
			leaves = append(leaves, e.Item.ID)
			continue
		}
		got, err := summaryLeaves(ctx, tx, e.Summary.ID)
		if err != nil {
			return err
		}
		if len(got) != e.Summary.Items || got[0] != e.Summary.FirstItem || got[len(got)-1] != e.Summary.LastItem || e.Position != e.Summary.FirstItem {
			return fmt.Errorf("coverage: summary s%d records items %d..%d (%d) but covers %v", e.Summary.ID, e.Summary.FirstItem, e.Summary.LastItem, e.Summary.Items, got)
		}
		leaves = append(leaves, got...)
	}
	if !slices.Equal(all, leaves) {
		return fmt.Errorf("coverage: the epoch's %d items are represented as %d leaves, not exactly once in order", len(all), len(leaves))
	}
	return nil
}

// summaryLeaves returns the items a summary covers, in order, through its
// descendants.
func summaryLeaves(ctx context.Context, q querier, id int64) ([]int64, error) {
	kids, err := children(ctx, q, id)
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, k := range kids {
		if k.Summary != 0 {
			sub, err := summaryLeaves(ctx, q, k.Summary)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		} else {
			out = append(out, k.Item)
		}
	}
	return out, nil
}

func children(ctx context.Context, q querier, id int64) ([]EntryRef, error) {
	rows, err := q.QueryContext(ctx, `SELECT COALESCE(item_id, 0), COALESCE(child_summary_id, 0) FROM summary_children
		WHERE summary_id = ? ORDER BY position`, id)
	if err != nil {
		return nil, fmt.Errorf("summary s%d: %w", id, err)
	}
	defer rows.Close()
	var out []EntryRef
	for rows.Next() {
		var r EntryRef
		if err := rows.Scan(&r.Item, &r.Summary); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
