package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// history_fts is the lexical index: a projection of the originals (every
// record but notices) and of the summaries, rebuilt from them at will
// (RebuildHistoryIndex). Each row's meta column holds scope tokens, so a
// scoped search is answered from the index.

// maxIndexedBytes bounds the text one record contributes to the index; the
// original keeps everything, history.read returns it.
const maxIndexedBytes = 32 << 10

// metaToken spells a scope value as one token the tokenizer keeps whole.
func metaToken(prefix, value string) string {
	h := sha256.Sum256([]byte(value))
	return prefix + hex.EncodeToString(h[:8])
}

func eventMeta(session string, lane Lane, conversation string) string {
	m := metaToken("s", session) + " l" + string(lane)
	if conversation != "" {
		m += " " + metaToken("c", conversation)
	}
	return m
}

// searchText is what a record contributes to the index: the string values
// of its content, in a stable order, bounded.
func searchText(content string) (text, conversation string) {
	var v any
	if json.Unmarshal([]byte(content), &v) != nil {
		return clip(content), ""
	}
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		if b.Len() >= maxIndexedBytes {
			return
		}
		switch x := v.(type) {
		case string:
			b.WriteString(x)
			b.WriteByte('\n')
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k])
			}
		}
	}
	walk(v)
	if m, ok := v.(map[string]any); ok {
		conversation, _ = m["conversation"].(string)
	}
	return clip(b.String()), conversation
}

func clip(s string) string {
	if len(s) <= maxIndexedBytes {
		return s
	}
	s = s[:maxIndexedBytes]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

func (t *Tx) indexSummary(id int64, session, text string, scopes []string) error {
	meta := metaToken("s", session) + " lsummary"
	for _, s := range scopes {
		if c, ok := strings.CutPrefix(s, "discord:"); ok {
			meta += " " + metaToken("c", c)
		}
	}
	if _, err := t.exec(`INSERT INTO history_fts (rowid, body, meta) VALUES (?, ?, ?)`, -id, text, meta); err != nil {
		return fmt.Errorf("index summary: %w", err)
	}
	return nil
}

// catchUpIndex indexes the records written since the index last looked
// (a database upgraded to 0008, or records a stop left unindexed): the
// events after history_index.through. It returns the new watermark.
func catchUpIndex(ctx context.Context, db *sql.DB) (int64, error) {
	var through int64
	if err := db.QueryRowContext(ctx, `SELECT through FROM history_index WHERE id = 1`).Scan(&through); err != nil {
		return 0, fmt.Errorf("history index: %w", err)
	}
	return indexEvents(ctx, db, through)
}

// indexBatch bounds the records one index transaction takes.
const indexBatch = 2000

// indexDelay is how long the indexer lets appends gather before it
// indexes them in one transaction.
const indexDelay = 500 * time.Millisecond

func (s *Store) kickIndexer() {
	select {
	case s.indexKick <- struct{}{}:
	default:
	}
}

// indexer indexes appended records in batches, off the write path of the
// appends themselves. It sleeps until an append kicks it.
func (s *Store) indexer() {
	defer close(s.indexerDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-s.indexKick:
			timer.Reset(indexDelay)
			select {
			case <-s.closing:
				return
			case <-timer.C:
			}
			if err := s.syncIndex(ctx); err != nil && ctx.Err() == nil && s.log != nil {
				s.log.Warn("history index: catching up failed; the next append or search retries", "error", err)
			}
		}
	}
}

// syncIndex indexes every record appended since the last catch-up.
func (s *Store) syncIndex(ctx context.Context) error {
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	return s.syncIndexLocked(ctx)
}

func (s *Store) syncIndexLocked(ctx context.Context) error {
	// Nothing new (a kick from an append that rolled back), or writes are
	// failing: no write. An empty write would prove nothing about storage.
	var newest sql.NullInt64
	if err := s.rdb.QueryRowContext(ctx, `SELECT max(id) FROM events`).Scan(&newest); err != nil {
		return fmt.Errorf("history index: %w", err)
	}
	if newest.Int64 <= s.indexed.Load() || s.Fault() != nil {
		return nil
	}
	for {
		from := s.indexed.Load()
		var through int64
		var n int
		if err := s.Write(ctx, func(tx *Tx) (err error) {
			through, n, err = tx.indexAfter(from, indexBatch)
			return err
		}); err != nil {
			return err
		}
		s.indexed.Store(through)
		if n < indexBatch {
			return nil
		}
	}
}

// indexedEvent is a record as the index reads it.
type indexedEvent struct {
	id            int64
	session, lane string
	content       string
	collected     bool // retention collected its original: not indexed
}

// eventsAfterQuery reads the records after an event id, in order, bounded.
const eventsAfterQuery = `SELECT e.id, e.session_id, i.lane, e.content, e.collected_at IS NOT NULL FROM events e
	JOIN session_items i ON i.event_id = e.id WHERE e.id > ? ORDER BY e.id LIMIT ?`

func scanIndexed(rows *sql.Rows, err error) ([]indexedEvent, error) {
	if err != nil {
		return nil, fmt.Errorf("history index: %w", err)
	}
	defer rows.Close()
	var out []indexedEvent
	for rows.Next() {
		var e indexedEvent
		if err := rows.Scan(&e.id, &e.session, &e.lane, &e.content, &e.collected); err != nil {
			return nil, fmt.Errorf("history index: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// ftsRow is one record's row of the index, or ok false for a record that
// is not indexed (a notice).
func ftsRow(e indexedEvent) (text, meta string, ok bool) {
	if Lane(e.lane) == LaneNotice || e.collected {
		return "", "", false
	}
	text, conv := searchText(e.content)
	return text, eventMeta(e.session, Lane(e.lane), conv), true
}

const ftsInsert = `INSERT INTO history_fts (rowid, body, meta) VALUES (?, ?, ?)`

// indexAfter indexes up to limit records with event ids after from and
// returns the highest id it looked at and how many.
func (t *Tx) indexAfter(from int64, limit int) (through int64, n int, err error) {
	batch, err := scanIndexed(t.query(eventsAfterQuery, from, limit))
	if err != nil {
		return 0, 0, err
	}
	through = from
	for _, e := range batch {
		if text, meta, ok := ftsRow(e); ok {
			if _, err := t.exec(ftsInsert, e.id, text, meta); err != nil {
				return 0, 0, fmt.Errorf("index record: %w", err)
			}
		}
		through = e.id
	}
	if through != from {
		if _, err := t.exec(`UPDATE history_index SET through = ? WHERE id = 1`, through); err != nil {
			return 0, 0, fmt.Errorf("history index: %w", err)
		}
	}
	return through, len(batch), nil
}

// indexEvents indexes, on db directly (at open, before the writer runs),
// the records after event id after, in batches, and returns the new
// watermark.
func indexEvents(ctx context.Context, db *sql.DB, after int64) (int64, error) {
	for {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		batch, err := scanIndexed(tx.QueryContext(ctx, eventsAfterQuery, after, indexBatch))
		for _, e := range batch {
			if err != nil {
				break
			}
			if text, meta, ok := ftsRow(e); ok {
				_, err = tx.ExecContext(ctx, ftsInsert, e.id, text, meta)
			}
			after = e.id
		}
		if err == nil && len(batch) > 0 {
			_, err = tx.ExecContext(ctx, `UPDATE history_index SET through = ? WHERE id = 1`, after)
		}
		if err != nil {
			tx.Rollback()
			return 0, fmt.Errorf("history index: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return 0, fmt.Errorf("history index: %w", err)
		}
		if len(batch) < indexBatch {
			return after, nil
		}
	}
}

// RebuildHistoryIndex drops the lexical index and builds it again from the
// originals and the summaries.
func (s *Store) RebuildHistoryIndex(ctx context.Context) error {
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	if err := s.Write(ctx, func(tx *Tx) error {
		if _, err := tx.exec(`DELETE FROM history_fts`); err != nil {
			return err
		}
		if _, err := tx.exec(`UPDATE history_index SET through = 0 WHERE id = 1`); err != nil {
			return err
		}
		rows, err := tx.query(`SELECT id, session_id, text, scopes FROM summaries ORDER BY id`)
		if err != nil {
			return err
		}
		type sm struct {
			id                    int64
			session, text, scopes string
		}
		var sums []sm
		for rows.Next() {
			var x sm
			if err := rows.Scan(&x.id, &x.session, &x.text, &x.scopes); err != nil {
				rows.Close()
				return err
			}
			sums = append(sums, x)
		}
		rows.Close()
		for _, x := range sums {
			var scopes []string
			_ = json.Unmarshal([]byte(x.scopes), &scopes)
			if err := tx.indexSummary(x.id, x.session, x.text, scopes); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("rebuild history index: %w", err)
	}
	s.indexed.Store(0)
	return s.syncIndexLocked(ctx)
}

// SearchScope narrows a search. Session is required.
type SearchScope struct {
	Session      string
	Conversation string    // a canonical conversation id (discord channel)
	Lane         string    // input, scratchpad, cell, speech, or summary
	Since, Until time.Time // zero: unbounded
	Before       int64     // continue a search: only hits older than this rowid cursor (0: from the newest)
}

// Hit is one search result.
type Hit struct {
	Ref     string    `json:"ref"`
	Kind    string    `json:"kind"`
	Lane    string    `json:"lane"`
	At      time.Time `json:"at"`
	Preview string    `json:"preview"`
	Cursor  int64     `json:"-"`
}

// SearchResult is a page of hits, newest first.
type SearchResult struct {
	Hits      []Hit `json:"results"`
	Truncated bool  `json:"truncated"`
	// Next continues the search (pass it as Before) when Truncated.
	Next int64 `json:"next,omitempty"`
}

// MaxSearchLimit bounds one page of search results.
const MaxSearchLimit = 200

// ftsQuery turns free text into an FTS5 query: each word a quoted term, all
// required. Operators in the text are just words.
func ftsQuery(q string) string {
	var terms []string
	for _, w := range strings.FieldsFunc(q, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsNumber(r) && r != '_' }) {
		terms = append(terms, `"`+w+`"`)
		if len(terms) == 32 {
			break
		}
	}
	return strings.Join(terms, " ")
}

// Search finds records and summaries matching query in scope, newest
// first. It is answered from the index; only the page's hits are read.
func (s *Store) Search(ctx context.Context, query string, sc SearchScope, limit int) (SearchResult, error) {
	var res SearchResult
	if err := s.syncIndex(ctx); err != nil {
		return res, fmt.Errorf("search: index the newest records: %w", err)
	}
	terms := ftsQuery(query)
	if terms == "" {
		return res, fmt.Errorf("search: the query has no words")
	}
	if limit <= 0 || limit > MaxSearchLimit {
		return res, fmt.Errorf("search: limit must be 1..%d", MaxSearchLimit)
	}
	// The session is checked against each candidate (newest first, the
	// page's worth read); lane and conversation narrow the match itself.
	var meta []string
	if sc.Conversation != "" {
		meta = append(meta, metaToken("c", sc.Conversation))
	}
	if sc.Lane != "" {
		switch sc.Lane {
		case "input", "scratchpad", "cell", "speech", "summary":
			meta = append(meta, "l"+sc.Lane)
		default:
			return res, fmt.Errorf("search: lane %q is not one of input, scratchpad, cell, speech, summary", sc.Lane)
		}
	}
	match := "body: (" + terms + ")"
	if len(meta) > 0 {
		match += " AND meta: (" + strings.Join(meta, " ") + ")"
	}
	smatch := match + " AND meta: (" + metaToken("s", sc.Session) + ")"
	before := int64(1<<62 - 1)
	if sc.Before != 0 {
		before = sc.Before
	}
	// Newest first: the index is read in rowid (event id) order and stops
	// at the page, so its cost follows the page, not the number of hits.
	rows, err := s.rdb.QueryContext(ctx, `SELECT f.rowid, snippet(history_fts, 0, '[', ']', '…', 12) FROM history_fts f
		JOIN events e ON e.id = f.rowid
		WHERE history_fts MATCH ? AND f.rowid < ? AND f.rowid > 0 AND e.session_id = ? ORDER BY f.rowid DESC LIMIT ?`, match, before, sc.Session, limit+1)
	if err != nil {
		return res, fmt.Errorf("search: %w", err)
	}
	type raw struct {
		id      int64
		preview string
	}
	var evs []raw
	for rows.Next() {
		var r raw
		if err := rows.Scan(&r.id, &r.preview); err != nil {
			rows.Close()
			return res, err
		}
		evs = append(evs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("search: %w", err)
	}
	if len(evs) > limit {
		evs, res.Truncated = evs[:limit], true
		res.Next = evs[limit-1].id
	}
	for _, r := range evs {
		var kind, lane string
		var at int64
		if err := s.rdb.QueryRowContext(ctx, `SELECT e.kind, i.lane, e.received_at FROM events e JOIN session_items i ON i.event_id = e.id WHERE e.id = ?`,
			r.id).Scan(&kind, &lane, &at); err != nil {
			return res, fmt.Errorf("search: record %d: %w", r.id, err)
		}
		t := time.UnixMilli(at)
		if (!sc.Since.IsZero() && t.Before(sc.Since)) || (!sc.Until.IsZero() && t.After(sc.Until)) {
			continue
		}
		res.Hits = append(res.Hits, Hit{Ref: EventRef(r.id), Kind: kind, Lane: lane, At: t, Preview: r.preview, Cursor: r.id})
	}
	// Summaries match too; there are few of them (each covers many records),
	// so they are read apart and placed by time. Not on a continued page.
	if sc.Before == 0 && (sc.Lane == "" || sc.Lane == "summary") {
		srows, err := s.rdb.QueryContext(ctx, `SELECT -f.rowid, snippet(history_fts, 0, '[', ']', '…', 12), m.created_at, m.kind
			FROM history_fts f JOIN summaries m ON m.id = -f.rowid
			WHERE history_fts MATCH ? AND f.rowid < 0 ORDER BY f.rowid LIMIT ?`, smatch, limit)
		if err != nil {
			return res, fmt.Errorf("search: %w", err)
		}
		for srows.Next() {
			var id, at int64
			var preview, kind string
			if err := srows.Scan(&id, &preview, &at, &kind); err != nil {
				srows.Close()
				return res, err
			}
			t := time.UnixMilli(at)
			if (!sc.Since.IsZero() && t.Before(sc.Since)) || (!sc.Until.IsZero() && t.After(sc.Until)) {
				continue
			}
			res.Hits = append(res.Hits, Hit{Ref: SummaryRef(id), Kind: "summary." + kind, Lane: "summary", At: t, Preview: preview})
		}
		srows.Close()
		sort.SliceStable(res.Hits, func(i, j int) bool { return res.Hits[i].At.After(res.Hits[j].At) })
		if len(res.Hits) > limit {
			var cut int64 // the newest record cut off by the summaries: the next page starts at it
			for _, h := range res.Hits[limit:] {
				cut = max(cut, h.Cursor)
			}
			res.Hits, res.Truncated = res.Hits[:limit], true
			if cut != 0 {
				res.Next = cut + 1
			}
			if res.Next == 0 {
				for i := len(res.Hits) - 1; i >= 0; i-- {
					if res.Hits[i].Cursor != 0 {
						res.Next = res.Hits[i].Cursor
						break
					}
				}
			}
		}
	}
	if res.Hits == nil {
		res.Hits = []Hit{}
	}
	return res, nil
}

// EventRef is a record's reference in history: "e<event id>".
func EventRef(id int64) string { return fmt.Sprintf("e%d", id) }
