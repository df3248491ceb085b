package daemon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// ageHistory moves every record of the data directory back by d, as if
// it had been received that long ago. Events are append-only, so the test
// lifts the trigger for one transaction and puts it back as it was.
func ageHistory(t *testing.T, data string, d time.Duration) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(data, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var trigger string
	if err := tx.QueryRow(`SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name = 'events_append_only_update'`).Scan(&trigger); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`DROP TRIGGER events_append_only_update`,
		fmt.Sprintf(`UPDATE events SET received_at = received_at - %d, occurred_at = occurred_at - %d`, d.Milliseconds(), d.Milliseconds()),
		trigger} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Online gc of history originals past [retention] history_days, through
// the running daemon while the agent works: it collects only originals a
// summary covers (never the fresh tail nor a cell's code, which no summary
// covers as a record), in bounded batches, and afterwards every reader is
// honest — tail's records and history read say "collected by retention on
// DATE", search no longer finds the text, check is clean, a backup
// restores the collection — and the turn loop's next requests are valid
// sequences that never carry a collected original.
func TestHistoryRetentionOnline(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var step, stop atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := step.Add(1)
		if stop.Load() != 0 && n >= stop.Load() {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d", n),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('orig%dmark', 'x' * 300)", n)}}}
	})
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "The agent printed numbered marks."}
	})
	stop.Store(80)
	a := startAgent(t, model, "context_budget_tokens = 6000\nmax_steps = 1000\n\n[retention]\nhistory_days = 1\n")
	a.send("print marks, one cell at a time")
	a.eventually("the session waits", a.state(store.StateWaiting))
	if len(a.kinds(store.LaneNotice, "context.compacted")) == 0 {
		t.Fatal("no compaction: nothing for retention to collect")
	}
	res, err := a.c.GC(t.Context())
	if err != nil || res.History.Records != 0 {
		t.Fatalf("gc with nothing past retention: %+v %v", res.History, err)
	}
	ageHistory(t, a.data, 72*time.Hour)

	// The agent works while gc runs.
	stop.Store(step.Load() + 30)
	a.send("print thirty more")
	res, err = a.c.GC(t.Context())
	if err != nil || res.History.Records == 0 || res.History.Bytes == 0 {
		t.Fatalf("online gc of history: %+v %v", res.History, err)
	}
	a.eventually("the session waits again", func() bool { return a.session().State == store.StateWaiting && step.Load() >= stop.Load() })

	collected := map[int64]store.Record{}
	for _, r := range a.records() {
		if r.Collected == nil {
			continue
		}
		collected[r.ID] = r
		if !strings.HasPrefix(r.Collected.Reason, "retention.history_days = 1") || strings.Contains(string(r.Content), "orig") {
			t.Fatalf("record e%d after collection: %+v %s", r.ID, r.Collected, r.Content)
		}
		if r.Kind == "cell.started" {
			t.Fatalf("a cell's code was collected (no summary covers it as a record): e%d", r.ID)
		}
	}
	if int64(len(collected)) != res.History.Records {
		t.Fatalf("%d records say they were collected, gc collected %d", len(collected), res.History.Records)
	}
	// Search: a collected cell's output is gone, its code (no context item) stays.
	hits, err := a.c.SearchHistory(t.Context(), "default", "orig3mark", history.Scope{Lane: "cell"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, h := range hits.Hits {
		kinds = append(kinds, h.Kind)
		p, _ := store.ParseRef(h.Ref)
		if _, gone := collected[p.Event]; gone {
			t.Fatalf("search finds collected %s", h.Ref)
		}
	}
	if fmt.Sprint(kinds) != "[cell.started]" {
		t.Fatalf("search orig3mark: %v, want only the cell's code", kinds)
	}
	var some int64
	for id := range collected {
		some = id
		break
	}
	rec, err := a.c.ReadHistory(t.Context(), store.EventRef(some), 10000, 0)
	if err != nil || !strings.HasPrefix(rec.Text, "collected by retention on "+time.Now().UTC().Format(time.DateOnly)) ||
		rec.CoveredBy == "" || !strings.Contains(rec.Text, rec.CoveredBy) {
		t.Fatalf("read a collected record: %+v %v", rec, err)
	}
	// The turn loop: every request after gc is a valid sequence and
	// carries no collected original.
	for i, req := range model.Requests() {
		if len(req.Tools) == 0 {
			continue
		}
		if err := validSequence(req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := json.Marshal(req.Body["messages"])
		if strings.Contains(string(b), "collected by retention") {
			t.Fatalf("request %d carries a collected record", i)
		}
	}
	// check, online.
	chk, err := datadir.Check(t.Context(), a.data)
	if err != nil || !chk.Clean() {
		t.Fatalf("check: %+v %v", chk.Findings, err)
	}
	// A backup carries the collection; its restore reads the same.
	dest := filepath.Join(t.TempDir(), "backup")
	if _, err := datadir.Backup(t.Context(), datadir.BackupOptions{DataDir: a.data}, dest); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	if _, err := datadir.Restore(t.Context(), dest, restored); err != nil {
		t.Fatal(err)
	}
	if chk, err := datadir.Check(t.Context(), restored); err != nil || !chk.Clean() {
		t.Fatalf("check of the restore: %+v %v", chk.Findings, err)
	}
	st, err := store.OpenReader(t.Context(), restored)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o, err := st.Original(t.Context(), store.EventRef(some))
	if err != nil || o.Collected == nil || o.Text != rec.Text {
		t.Fatalf("the restored record: %+v %v", o, err)
	}
	// Another gc collects only what summaries covered since (the aged
	// fresh tail, compacted after the first gc), never a record twice; the
	// one after it finds nothing.
	again, err := a.c.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if last, err := a.c.GC(t.Context()); err != nil || last.History.Records != 0 {
		t.Fatalf("a third gc: %+v %v", last.History, err)
	}
	n := 0
	for _, r := range a.records() {
		if r.Collected != nil {
			n++
		}
	}
	if int64(n) != res.History.Records+again.History.Records {
		t.Fatalf("%d records collected, the gcs reported %d + %d", n, res.History.Records, again.History.Records)
	}
}

// SIGKILL of klbr-core while online gc collects history, 20 times at
// random instants: each batch is one transaction, so after every restart
// check is clean (no record half collected: its content is the stub, its
// index row gone, a normal summary covers it), and the gc after the last
// restart collects the rest.
func TestHistoryRetentionSurvivesSIGKILL(t *testing.T) {
	const rounds = 20
	model := modeltest.New()
	defer model.Close()
	var step atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := step.Add(1)
		if n >= 200 {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d %s", n, strings.Repeat("t", 2000)),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('orig%dmark', 'x' * 2000)", n)}}}
	})
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "The agent printed numbered marks."}
	})
	a := startAgent(t, model, "context_budget_tokens = 8000\nmax_steps = 1000\n\n[retention]\nhistory_days = 1\n")
	a.send("print marks, one cell at a time")
	a.eventually("the session waits", a.state(store.StateWaiting))
	ageHistory(t, a.data, 72*time.Hour)
	rng := rand.New(rand.NewPCG(5, 6))
	collected := func() int64 {
		t.Helper()
		st, err := store.OpenReader(t.Context(), a.data)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		c, err := st.HistoryCollected(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return c.Records
	}
	midway := 0
	for i := range rounds {
		before := collected()
		done := make(chan struct{})
		go func() { a.c.GC(context.Background()); close(done) }()
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		a.kill()
		<-done
		chk, err := datadir.Check(t.Context(), a.data)
		if err != nil || !chk.Clean() {
			t.Fatalf("round %d: check after the kill: %+v %v", i, chk.Findings, err)
		}
		if after := collected(); after > before {
			midway++
		}
		a.start()
	}
	res, err := a.c.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if again, err := a.c.GC(t.Context()); err != nil || again.History.Records != 0 {
		t.Fatalf("a gc after the last: %+v %v", again.History, err)
	}
	total := collected()
	if midway == 0 || total == 0 || res.History.Records == total {
		t.Fatalf("no kill landed while gc collected (%d of %d rounds collected something; the last gc collected %d of %d)", midway, rounds, res.History.Records, total)
	}
	n := 0
	for _, r := range a.records() {
		if r.Collected != nil {
			n++
			if strings.Contains(string(r.Content), "orig") || strings.Contains(string(r.Content), "step ") {
				t.Fatalf("e%d is marked collected but holds content: %s", r.ID, r.Content)
			}
		}
	}
	if int64(n) != total {
		t.Fatalf("%d records say they were collected, the store counts %d", n, total)
	}
	t.Logf("%d of %d kills landed after some batches had committed; %d records collected in all", midway, rounds, total)
}

// [retention] applies at a reload: the running daemon's gc collects under
// the file in force, not the one it started with. Started keeping every
// original, a gc of aged, summarized history collects nothing; after a
// reload to history_days = 1 the next gc collects.
func TestRetentionChangesAtReload(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var step, stop atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := step.Add(1)
		if stop.Load() != 0 && n >= stop.Load() {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d", n),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('orig%dmark', 'x' * 300)", n)}}}
	})
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "The agent printed numbered marks."}
	})
	stop.Store(80)
	agentToml := "context_budget_tokens = 6000\nmax_steps = 1000\n"
	a := startAgent(t, model, agentToml)
	a.send("print marks, one cell at a time")
	a.eventually("the session waits", a.state(store.StateWaiting))
	if len(a.kinds(store.LaneNotice, "context.compacted")) == 0 {
		t.Fatal("no compaction: nothing for retention to collect")
	}
	ageHistory(t, a.data, 72*time.Hour)
	res, err := a.c.GC(t.Context())
	if err != nil || res.History.Records != 0 {
		t.Fatalf("gc with no history_days: %+v %v", res.History, err)
	}

	a.writeConfig(fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n%s\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 30\n\n[retention]\nhistory_days = 1\n",
		agentToml, model.URL()))
	got, err := a.c.Reload(t.Context())
	if err != nil || !strings.Contains(strings.Join(got.Applied, "\n"), "[retention]") {
		t.Fatalf("reload: %+v %v", got, err)
	}
	for _, r := range got.Restart {
		if strings.Contains(r, "retention") {
			t.Fatalf("reload names [retention] as needing a restart: %q", got.Restart)
		}
	}
	res, err = a.c.GC(t.Context())
	if err != nil || res.History.Records == 0 {
		t.Fatalf("gc after the reload to history_days = 1: %+v %v", res.History, err)
	}
}
