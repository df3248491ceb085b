package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// addItem appends a record to session's context as role (a test shortcut
// for the turn loop's writes).
func addItem(t *testing.T, s *Store, session, role, text string) {
	t.Helper()
	if err := s.Write(context.Background(), func(tx *Tx) error {
		lane := map[string]Lane{"input": LaneInput, "assistant": LaneScratchpad, "tool": LaneCell, "notice": LaneNotice}[role]
		ev, _, err := tx.appendItem(session, "test."+role, lane, fmt.Sprintf(`{"text":%q}`, text), tx.now, tx.now)
		if err != nil {
			return err
		}
		call := ""
		if role == "tool" {
			call = fmt.Sprintf("call-%d", ev)
		}
		return tx.addContext(session, role, ev, call)
	}); err != nil {
		t.Fatal(err)
	}
}

func newHistoryStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Write(context.Background(), func(tx *Tx) error { _, err := tx.EnsureSession("p"); return err }); err != nil {
		t.Fatal(err)
	}
	return s
}

// Random histories, random compactions (valid and not): the store accepts
// exactly the contiguous runs of the current version, and after every
// commit each item of the epoch is represented exactly once, in order, and
// is recoverable through the summaries' children.
func TestCoverageInvariantUnderRandomCompactions(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			s := newHistoryStore(t)
			roles := []string{"input", "assistant", "tool", "notice"}
			accepted, refused := 0, 0
			for round := range 60 {
				for range rng.IntN(6) {
					addItem(t, s, "p", roles[rng.IntN(len(roles))], fmt.Sprintf("round %d word%d", round, rng.IntN(50)))
				}
				if rng.IntN(10) == 0 {
					if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.ResetContext("p", "test"); return err }); err != nil {
						t.Fatal(err)
					}
				}
				sess, err := s.Session(ctx, "p")
				if err != nil {
					t.Fatal(err)
				}
				ac, err := s.Active(ctx, "p", sess.ContextEpoch, 0)
				if err != nil {
					t.Fatal(err)
				}
				if len(ac.Entries) < 2 {
					continue
				}
				// A run, sometimes spoiled: a gap, a stale version, or out of order.
				i := rng.IntN(len(ac.Entries) - 1)
				j := i + 1 + rng.IntN(len(ac.Entries)-i-1)
				var refs []EntryRef
				for _, e := range ac.Entries[i : j+1] {
					refs = append(refs, e.Ref())
				}
				version, valid := ac.Version, true
				switch rng.IntN(6) {
				case 0:
					if len(refs) > 2 {
						refs = append(refs[:1], refs[2:]...) // a gap
						valid = false
					}
				case 1:
					version-- // stale
					valid = false
				case 2:
					if len(refs) > 1 {
						refs[0], refs[1] = refs[1], refs[0]
						valid = false
					}
				}
				err = s.Write(ctx, func(tx *Tx) error {
					_, err := tx.CommitSummary(NewSummary{Session: "p", Epoch: ac.Epoch, Version: version, Covers: refs,
						Kind: SummaryNormal, Text: fmt.Sprintf("summary of round %d", round), SourceTokens: 100, SummaryTokens: 10})
					return err
				})
				if valid != (err == nil) {
					t.Fatalf("round %d: valid=%v but commit: %v", round, valid, err)
				}
				if err == nil {
					accepted++
				} else {
					refused++
				}
				if err := s.CheckCoverage(ctx, "p", sess.ContextEpoch); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if accepted == 0 || refused == 0 {
				t.Fatalf("accepted %d, refused %d: the test did not exercise both", accepted, refused)
			}
		})
	}
}

// The triggers refuse what the Go checks would: an entry dropped without a
// covering summary, an item covered twice, a covered item put back.
func TestHistoryTriggersRefuseLoss(t *testing.T) {
	ctx := context.Background()
	s := newHistoryStore(t)
	for i := range 4 {
		addItem(t, s, "p", "input", fmt.Sprint("hello ", i))
	}
	ac, _ := s.Active(ctx, "p", 0, 0)
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.CommitSummary(NewSummary{Session: "p", Epoch: 0, Version: ac.Version, Covers: []EntryRef{ac.Entries[0].Ref(), ac.Entries[1].Ref()},
			Kind: SummaryNormal, Text: "first two", SourceTokens: 10, SummaryTokens: 2})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]string{
		"drop an uncovered entry": `DELETE FROM context_entries WHERE item_id = ` + fmt.Sprint(ac.Entries[3].Item.ID),
		"cover an item twice":     `INSERT INTO summary_children (summary_id, position, item_id) VALUES (1, 9, ` + fmt.Sprint(ac.Entries[0].Item.ID) + `)`,
		"put a covered item back": `INSERT INTO context_entries (session_id, context_epoch, position, item_id) VALUES ('p', 0, 999999, ` + fmt.Sprint(ac.Entries[0].Item.ID) + `)`,
		"change a summary":        `UPDATE summaries SET text = 'rewritten'`,
		"delete an original":      `DELETE FROM context_items`,
	} {
		err := s.Write(ctx, func(tx *Tx) error { _, err := tx.exec(q); return err })
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := s.CheckCoverage(ctx, "p", 0); err != nil {
		t.Fatal(err)
	}
}

// Search finds originals and summaries by words, scoped to the session and
// lane, newest first, with a continuation; read returns the exact text.
func TestSearchAndRead(t *testing.T) {
	ctx := context.Background()
	s := newHistoryStore(t)
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.EnsureSession("other"); return err }); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		addItem(t, s, "p", "input", fmt.Sprintf("the zebra number %d ran", i))
	}
	addItem(t, s, "other", "input", "a zebra elsewhere")
	addItem(t, s, "p", "assistant", "thinking about giraffes")
	res, err := s.Search(ctx, "zebra", SearchScope{Session: "p"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hits) != 10 || !res.Truncated || res.Next == 0 || !strings.Contains(res.Hits[0].Preview, "29") {
		t.Fatalf("first page: %+v", res)
	}
	all := len(res.Hits)
	for res.Truncated {
		if res, err = s.Search(ctx, "zebra", SearchScope{Session: "p", Before: res.Next}, 10); err != nil {
			t.Fatal(err)
		}
		all += len(res.Hits)
	}
	if all != 30 {
		t.Fatalf("pages hold %d hits, want 30 (the other session's stays out)", all)
	}
	if res, _ := s.Search(ctx, "giraffes", SearchScope{Session: "p", Lane: "input"}, 10); len(res.Hits) != 0 {
		t.Fatalf("lane scope: %+v", res)
	}
	res, _ = s.Search(ctx, "giraffes", SearchScope{Session: "p", Lane: "scratchpad"}, 10)
	if len(res.Hits) != 1 {
		t.Fatalf("scratchpad: %+v", res)
	}
	o, err := s.Original(ctx, res.Hits[0].Ref)
	if err != nil || o.Text != "thinking about giraffes" {
		t.Fatalf("read %s: %+v %v", res.Hits[0].Ref, o, err)
	}
	if _, err := s.Search(ctx, `"AND OR NEAR(`, SearchScope{Session: "p"}, 10); err != nil {
		t.Fatalf("operators are words: %v", err)
	}
	for _, bad := range []string{"", "x1", "e0", "s-1", "e12345678901234567890", "a" + strings.Repeat("g", 64)} {
		if _, err := s.Describe(ctx, bad); err == nil {
			t.Errorf("ref %q accepted", bad)
		}
	}
}

// FuzzParseRef: references come from cells and the CLI.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"e1", "s12", "a" + strings.Repeat("0", 64), "", "e", "E1", "e01", "s99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		p, err := ParseRef(ref)
		if err != nil {
			return
		}
		if (p.Event != 0) == (p.Summary != 0) && p.Artifact == "" || p.Event < 0 || p.Summary < 0 {
			t.Fatalf("%q parsed as %+v", ref, p)
		}
	})
}

// FuzzFTSQuery: any query text becomes a valid FTS5 query or none.
func FuzzFTSQuery(f *testing.F) {
	s, err := Open(context.Background(), f.TempDir(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	for _, q := range []string{"zebra", `"a" OR b*`, "NEAR(x y)", "col:val", "^start", "ünïcödé 中文", "-x +y"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		_, err := s.Search(context.Background(), q, SearchScope{Session: "p"}, 5)
		if err != nil && ftsQuery(q) != "" {
			t.Fatalf("query %q (%s): %v", q, ftsQuery(q), err)
		}
	})
}

// The index is a projection kept off the write path: the indexer catches up
// shortly after appends, a search catches up first, and records a stop left
// unindexed are indexed when the store opens again.
func TestHistoryIndexCatchesUp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.EnsureSession("p"); return err }); err != nil {
		t.Fatal(err)
	}
	indexed := func(s *Store) int {
		var n int
		if err := s.rdb.QueryRow(`SELECT count(*) FROM history_fts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	addItem(t, s, "p", "input", "first okapi")
	deadline := time.Now().Add(10 * time.Second)
	for indexed(s) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the indexer did not index the append")
		}
		time.Sleep(20 * time.Millisecond)
	}
	addItem(t, s, "p", "input", "second okapi")
	if res, err := s.Search(ctx, "okapi", SearchScope{Session: "p"}, 10); err != nil || len(res.Hits) != 2 {
		t.Fatalf("a search right after the append: %+v %v", res, err)
	}
	addItem(t, s, "p", "input", "third okapi")
	s.Close() // before the indexer's delay: the third is not indexed yet
	s, err = Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := indexed(s); n != 3 {
		t.Fatalf("%d records indexed after reopening, want 3", n)
	}
	// Rebuilt from the originals, the index says the same.
	if err := s.RebuildHistoryIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Search(ctx, "okapi", SearchScope{Session: "p"}, 10); err != nil || len(res.Hits) != 3 || indexed(s) != 3 {
		t.Fatalf("after a rebuild: %+v %v, %d rows", res, err, indexed(s))
	}
}
