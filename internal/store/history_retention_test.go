package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// summarize commits a summary of kind over the first n active entries of
// session's current epoch.
func summarize(t *testing.T, s *Store, session, kind string, n int) int64 {
	t.Helper()
	ctx := context.Background()
	sess, err := s.Session(ctx, session)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := s.Active(ctx, session, sess.ContextEpoch, 0)
	if err != nil {
		t.Fatal(err)
	}
	var refs []EntryRef
	for _, e := range ac.Entries[:n] {
		refs = append(refs, e.Ref())
	}
	var id int64
	if err := s.Write(ctx, func(tx *Tx) (err error) {
		id, err = tx.CommitSummary(NewSummary{Session: session, Epoch: ac.Epoch, Version: ac.Version, Covers: refs,
			Kind: kind, Text: "a " + kind + " summary", SourceTokens: 100, SummaryTokens: 10})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// eventsOf lists session's event ids in order.
func eventsOf(t *testing.T, s *Store, session string) []int64 {
	t.Helper()
	recs, err := s.Records(context.Background(), session, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func collect(s *Store, id int64) (int64, error) {
	var n int64
	err := s.Write(context.Background(), func(tx *Tx) (err error) {
		n, err = tx.CollectEvent(id, "retention.history_days = 1: test")
		return err
	})
	return n, err
}

// The schema lets an original's content be collected only when a normal
// summary covers it: one a degraded stub covers, one no summary covers,
// and a record that was never in a context are refused; every other change
// of an event stays refused, and a collection happens once.
func TestCollectOnlyWhatANormalSummaryCovers(t *testing.T) {
	ctx := context.Background()
	s := newHistoryStore(t)
	for i := range 6 {
		addItem(t, s, "p", []string{"input", "assistant", "tool"}[i%3], fmt.Sprintf("original number %d", i))
	}
	var notice int64
	if err := s.Write(ctx, func(tx *Tx) (err error) {
		notice, err = tx.Notice("p", "test.notice", map[string]any{"text": "never in a context"}, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	summarize(t, s, "p", SummaryNormal, 2)   // items 0, 1
	summarize(t, s, "p", SummaryDegraded, 2) // items 2, 3
	ev := eventsOf(t, s, "p")
	for _, tc := range []struct {
		name string
		id   int64
	}{{"covered by a degraded stub", ev[2]}, {"covered by nothing", ev[5]}, {"never in a context", notice}} {
		if _, err := collect(s, tc.id); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: collected (%v), want the schema's refusal", tc.name, err)
		}
	}
	n, err := collect(s, ev[0])
	if err != nil || n != int64(len(`{"text":"original number 0"}`)) {
		t.Fatalf("collect a covered original: %d bytes, %v", n, err)
	}
	if n, err := collect(s, ev[0]); err != nil || n != 0 {
		t.Fatalf("a second collection: %d bytes, %v (want nothing)", n, err)
	}
	db, err := sql.Open(driverWrite, dsn(filepath.Join(s.Dir(), FileName)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`UPDATE events SET content = '{"text":"rewritten"}' WHERE id = ` + fmt.Sprint(ev[1]),
		`UPDATE events SET collected_at = 1, collected_reason = 'x', content = '{}' WHERE id = ` + fmt.Sprint(ev[1]),
		`UPDATE events SET collected_at = collected_at + 1 WHERE id = ` + fmt.Sprint(ev[0]),
		`UPDATE events SET kind = 'other' WHERE id = ` + fmt.Sprint(ev[0]),
	} {
		if _, err := db.Exec(q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want the schema's refusal", q, err)
		}
	}
}

// A collected record keeps its id, place and coverage; every reader says
// it was collected, by retention, when and why, instead of empty text: the
// records of tail and the browser, describe and read, search (it is gone
// from the index), the active context the turn loop reads, and check.
func TestCollectedRecordReadHonestly(t *testing.T) {
	ctx := context.Background()
	s := newHistoryStore(t)
	addItem(t, s, "p", "input", "the zebra password is tangerine")
	addItem(t, s, "p", "assistant", "noted the zebra")
	addItem(t, s, "p", "input", "a later zebra message")
	sum := summarize(t, s, "p", SummaryNormal, 2)
	ev := eventsOf(t, s, "p")
	if err := s.syncIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Search(ctx, "zebra", SearchScope{Session: "p"}, 20); err != nil || len(res.Hits) != 3 {
		t.Fatalf("before: %d hits, %v", len(res.Hits), err)
	}
	if _, err := collect(s, ev[0]); err != nil {
		t.Fatal(err)
	}

	recs, err := s.Records(ctx, "p", 0, 0)
	if err != nil || len(recs) != 4 || recs[0].ID != ev[0] { // three originals and the compaction's notice
		t.Fatalf("records: %+v %v", recs, err)
	}
	c := recs[0].Collected
	if c == nil || c.Reason != "retention.history_days = 1: test" || c.At.IsZero() || c.Bytes == 0 {
		t.Fatalf("the record does not say it was collected: %+v", recs[0])
	}
	if strings.Contains(string(recs[0].Content), "tangerine") || !strings.Contains(string(recs[0].Content), `"collected"`) {
		t.Fatalf("content after collection: %s", recs[0].Content)
	}
	if recs[1].Collected != nil || recs[2].Collected != nil {
		t.Fatal("records that were not collected say they were")
	}
	var m map[string]any
	if json.Unmarshal(recs[0].Content, &m) != nil {
		t.Fatalf("the stub is not JSON: %s", recs[0].Content)
	}

	o, err := s.Original(ctx, EventRef(ev[0]))
	if err != nil {
		t.Fatal(err)
	}
	want := "collected by retention on " + c.At.UTC().Format(time.DateOnly) + ": retention.history_days = 1: test; " + SummaryRef(sum) + " is the summary that covers it"
	if o.Text != want || o.Collected == nil || o.CoveredBy != SummaryRef(sum) || o.Size != 0 || o.Kind != "test.input" {
		t.Fatalf("read: %q (covered by %q, size %d, kind %s)\nwant %q", o.Text, o.CoveredBy, o.Size, o.Kind, want)
	}
	if res, err := s.Search(ctx, "tangerine", SearchScope{Session: "p"}, 20); err != nil || len(res.Hits) != 0 {
		t.Fatalf("the collected text is still found: %+v %v", res.Hits, err)
	}
	if res, err := s.Search(ctx, "zebra", SearchScope{Session: "p"}, 20); err != nil || len(res.Hits) != 2 {
		t.Fatalf("after: %+v %v (want the two records left)", res.Hits, err)
	}
	// A rebuilt index leaves it out too.
	if err := s.RebuildHistoryIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Search(ctx, "zebra", SearchScope{Session: "p"}, 20); err != nil || len(res.Hits) != 2 {
		t.Fatalf("after a rebuild: %+v %v", res.Hits, err)
	}
	kids, err := s.Children(ctx, SummaryRef(sum))
	if err != nil || len(kids) != 2 || kids[0].Ref != EventRef(ev[0]) {
		t.Fatalf("the summary's coverage: %+v %v", kids, err)
	}
	sess, _ := s.Session(ctx, "p")
	ac, err := s.Active(ctx, "p", sess.ContextEpoch, 0)
	if err != nil || len(ac.Entries) != 2 || ac.Entries[0].Summary == nil {
		t.Fatalf("active context: %+v %v", ac, err)
	}
	items, err := s.Context(ctx, "p", sess.ContextEpoch, 0)
	if err != nil || items[0].Collected == nil || items[1].Collected != nil {
		t.Fatalf("the epoch's items: %+v %v", items, err)
	}
	if f, err := s.CheckDB(ctx); err != nil || len(f) != 0 {
		t.Fatalf("check: %v %v", f, err)
	}
	got, err := s.HistoryCollected(ctx)
	if err != nil || got.Records != 1 || got.Bytes != c.Bytes {
		t.Fatalf("collected: %+v %v", got, err)
	}
}

// Only originals past the cutoff, covered, and not pinned by a running
// child's grant (an exact ref, a summary's coverage or a scope) are
// candidates; a finished child pins nothing.
func TestCollectableEventsHonourPins(t *testing.T) {
	ctx := context.Background()
	s := newHistoryStore(t)
	for i := range 8 {
		addItem(t, s, "p", "input", fmt.Sprintf("input %d", i))
	}
	sum := summarize(t, s, "p", SummaryNormal, 6)
	ev := eventsOf(t, s, "p")
	cutoff := time.Now().Add(time.Hour)
	all := func(p HistoryPins) []int64 {
		t.Helper()
		evs, _, err := s.CollectableEvents(ctx, 0, ev[len(ev)-1], cutoff, p, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, e := range evs {
			out = append(out, e.ID)
		}
		return out
	}
	if got := all(HistoryPins{}); fmt.Sprint(got) != fmt.Sprint(ev[:6]) {
		t.Fatalf("candidates %v, want the six covered %v", got, ev[:6])
	}
	if evs, _, err := s.CollectableEvents(ctx, 0, ev[len(ev)-1], time.Now().Add(-time.Hour), HistoryPins{}, 100); err != nil || len(evs) != 0 {
		t.Fatalf("younger than the cutoff: %v %v", evs, err)
	}
	spawn := func(refs []string) int64 {
		t.Helper()
		spec, _ := json.Marshal(map[string]any{"session": "c", "task": "t", "refs": refs})
		var id int64
		if err := s.Write(ctx, func(tx *Tx) (err error) {
			id, err = tx.InsertJob(NewJob{Kind: "child", Session: "p", Spec: spec, Recovery: "manual"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	spawn([]string{EventRef(ev[0]), "not a ref"})
	pins, err := s.HistoryPinsNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := all(pins); fmt.Sprint(got) != fmt.Sprint(ev[1:6]) {
		t.Fatalf("with e%d granted: %v", ev[0], got)
	}
	spawn([]string{SummaryRef(sum)})
	pins, _ = s.HistoryPinsNow(ctx)
	if got := all(pins); len(got) != 0 {
		t.Fatalf("with the summary granted: %v", got)
	}
	db, err := sql.Open(driverWrite, dsn(filepath.Join(s.Dir(), FileName)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE jobs SET state = 'cancelled', finished_at = 1, next_due = NULL`); err != nil {
		t.Fatal(err)
	}
	spawn([]string{"scope:agent"}) // what addItem's records are
	pins, _ = s.HistoryPinsNow(ctx)
	if got := all(pins); len(got) != 0 {
		t.Fatalf("with the agent scope granted: %v", got)
	}
	if _, err := db.Exec(`UPDATE jobs SET state = 'cancelled', finished_at = 1, next_due = NULL WHERE state <> 'cancelled'`); err != nil {
		t.Fatal(err)
	}
	pins, _ = s.HistoryPinsNow(ctx)
	if got := all(pins); len(got) != 6 {
		t.Fatalf("finished children still pin: %v", got)
	}
}
