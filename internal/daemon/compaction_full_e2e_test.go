package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// The data disk is full at the instant a summary commits (the summarizer's
// answer is held until a filler has taken every free byte of the data
// directory's tmpfs, then released), 20 times, with a browser's WebSocket
// connected: half the rounds SIGKILL klbr-core while the disk is full (the
// filler goes before the restart), half free the disk and let the same
// daemon go on. After every round check is clean (coverage holds: nothing
// covered twice, nothing lost); in the end every agent request was a valid
// sequence, compactions committed, and the socket received every record of
// the session exactly once.
func TestCompactionOnAFullDisk(t *testing.T) {
	const rounds = 20
	requirePython(t)
	data, env := smallDataDir(t, 48<<20)
	model := modeltest.New()
	defer model.Close()
	var steps atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := steps.Add(1)
		return modeltest.Reply{Text: "working", Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: "print('z' * 400)"}}}
	})
	asked := make(chan struct{}, 1000)
	release := make(chan struct{})
	var holding atomic.Bool
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		if holding.Load() {
			asked <- struct{}{}
			<-release
		}
		return modeltest.Reply{Text: "The agent printed z."}
	})
	defer func() {
		holding.Store(false)
		close(release)
	}()
	a := startAgentAt(t, model, "context_budget_tokens = 6000\nmax_steps = 10000\nmax_turn_seconds = 3600\n", "", data, env)
	token, err := os.ReadFile(setup.TokenFile(a.data))
	if err != nil {
		t.Fatal(err)
	}
	f := &wsFollower{token: strings.TrimSpace(string(token)), seen: map[int64]int{}}
	f.addr.Store(readyAddr(t, a.d))
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { f.run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	holding.Store(true)
	a.send("print until stopped")
	full := 0
	for i := range rounds {
		select {
		case <-asked:
		case <-time.After(90 * time.Second):
			t.Fatalf("round %d: no summary request\n%s", i, a.d)
		}
		// A second without writes: the writer truncates the WAL to zero,
		// so the commit needs new blocks of the full disk.
		time.Sleep(1500 * time.Millisecond)
		filler := fill(t, data)
		full++
		release <- struct{}{} // the answer arrives: the commit meets the full disk
		time.Sleep(100 * time.Millisecond)
		if i%2 == 0 {
			a.kill()
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			a.start()
			f.addr.Store(readyAddr(t, a.d))
		} else if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		chk, err := datadir.Check(t.Context(), a.data)
		if err != nil || !chk.Clean() {
			t.Fatalf("round %d: check: %+v %v", i, chk.Findings, err)
		}
	}
	holding.Store(false)
	before := steps.Load()
	a.eventually("the agent goes on", func() bool { return steps.Load() > before+20 })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	for i, req := range model.Requests() {
		if len(req.Tools) == 0 {
			continue
		}
		if err := validSequence(req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	compacted := len(a.kinds(store.LaneNotice, "context.compacted"))
	if compacted == 0 {
		t.Fatal("no compaction committed")
	}
	want := a.records()
	last := want[len(want)-1].Seq
	a.eventually("the socket has every record", func() bool { return f.cursor() >= last })
	cancel()
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, n := range f.seen {
		if n != 1 {
			t.Errorf("record e%d received %d times", id, n)
		}
	}
	var got, exp []int64
	for _, r := range f.recs {
		if r.Seq <= last {
			got = append(got, r.ID)
		}
	}
	for _, r := range want {
		exp = append(exp, r.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(exp) {
		t.Fatalf("the socket received %d records, the session holds %d (first difference at %d)", len(got), len(exp), firstDiff(got, exp))
	}
	notices := a.kinds(store.LaneNotice, "storage")
	faults := len(notices)
	if faults == 0 {
		t.Fatal("no storage fault: the commits never met the full disk")
	}
	t.Logf("the first storage notice: %s", notices[0].Content)
	t.Logf("%d rounds on a full disk, %d compactions committed, %d storage notices, %d records over %d connections", full, compacted, faults, len(got), f.conns)
}
