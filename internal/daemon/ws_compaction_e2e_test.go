package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/web"
)

// wsFollower is a real WebSocket client of /v2/ws that follows the default
// session across daemon restarts: on each connection it says hello with
// the last seq it saw, as the page does, and keeps every record it is sent.
type wsFollower struct {
	token string
	addr  atomic.Value // "host:port" of the daemon now serving

	mu        sync.Mutex
	recs      []store.Record
	seen      map[int64]int // event id → times received
	conns     int
	maxLag    time.Duration // live records only: receipt time − commit time
	lastSeq   int64
	replaying bool
}

func (f *wsFollower) cursor() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastSeq
}

// run connects and reconnects until ctx ends.
func (f *wsFollower) run(ctx context.Context) {
	for ctx.Err() == nil {
		f.session(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (f *wsFollower) session(ctx context.Context) {
	addr, _ := f.addr.Load().(string)
	if addr == "" {
		return
	}
	hdr := http.Header{}
	hdr.Set("Cookie", web.CookieName+"="+f.token)
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, _, err := websocket.Dial(dctx, "ws://"+addr+"/v2/ws", &websocket.DialOptions{HTTPHeader: hdr})
	cancel()
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(16 << 20)
	hello, _ := json.Marshal(map[string]any{"type": "hello", "session": "default", "cursor": f.cursor()})
	if err := c.Write(ctx, websocket.MessageText, hello); err != nil {
		return
	}
	f.mu.Lock()
	f.conns++
	f.replaying = true // what comes first is the replay after the cursor
	f.mu.Unlock()
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return // the daemon was killed: reconnect
		}
		now := time.Now()
		var m struct {
			Type    string         `json:"type"`
			Records []store.Record `json:"records"`
			More    bool           `json:"more"`
		}
		if json.Unmarshal(b, &m) != nil || m.Type != web.MsgRecords {
			continue
		}
		f.mu.Lock()
		for _, r := range m.Records {
			f.recs = append(f.recs, r)
			f.seen[r.ID]++
			f.lastSeq = max(f.lastSeq, r.Seq)
			if lag := now.Sub(r.At); !f.replaying && lag > f.maxLag {
				f.maxLag = lag
			}
		}
		if !m.More {
			f.replaying = false
		}
		f.mu.Unlock()
	}
}

// readyAddr is the HTTP address the daemon's READY line names (the line
// may come a moment after the control socket answers).
func readyAddr(t *testing.T, d *child) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, after, ok := strings.Cut(d.String(), "READY http="); ok {
			addr, _, _ := strings.Cut(after, " ")
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("no READY line:\n%s", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A browser's WebSocket connected across SIGKILLs of klbr-core while the
// context is being compacted — while the summary is generated (20 times)
// and around its commit (20 times) — reconnects to each new daemon with its
// cursor and, in the end, has received every record of the session exactly
// once, in order: none lost in a kill, none repeated by a replay. The lag
// of live records behind their commit is logged.
func TestWebSocketAcrossCompactionKills(t *testing.T) {
	const rounds = 20
	model := modeltest.New()
	defer model.Close()
	hold := make(chan struct{})
	defer close(hold) // before model.Close: a held summary request returns
	var steps atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := steps.Add(1)
		return modeltest.Reply{Text: "working", Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: "print('z' * 400)"}}}
	})
	var hang atomic.Bool
	summaries := make(chan struct{}, 1000)
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		summaries <- struct{}{}
		if hang.Load() {
			<-hold
		}
		return modeltest.Reply{Text: "The agent printed z."}
	})
	a := startAgent(t, model, "context_budget_tokens = 6000\nmax_steps = 10000\nmax_turn_seconds = 600\n")
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

	a.send("print until stopped")
	wait := func() {
		t.Helper()
		select {
		case <-summaries:
		case <-time.After(60 * time.Second):
			t.Fatalf("no summary request\n%s", a.d)
		}
	}
	restart := func() {
		t.Helper()
		a.kill()
		a.start()
		f.addr.Store(readyAddr(t, a.d))
	}
	hang.Store(true)
	for range rounds {
		wait() // a summary is being generated
		restart()
	}
	hang.Store(false)
	rng := rand.New(rand.NewPCG(3, 4))
	for range rounds {
		wait()
		time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond) // the answer arrives, is validated, commits
		restart()
	}
	before := steps.Load()
	a.eventually("the agent goes on", func() bool { return steps.Load() > before+20 })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
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
	seqs := make([]int64, 0, len(f.recs))
	for _, r := range f.recs {
		seqs = append(seqs, r.Seq)
	}
	if !slices.IsSorted(seqs) {
		t.Error("records arrived out of order across reconnects")
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
	if !slices.Equal(got, exp) {
		t.Fatalf("the socket received %d records, the session holds %d (first difference at %d)", len(got), len(exp), firstDiff(got, exp))
	}
	if f.conns < rounds { // a reconnect per kill, unless a daemon died before the socket reached it
		t.Fatalf("%d connections across %d kills", f.conns, 2*rounds)
	}
	if n := len(a.kinds(store.LaneNotice, "context.compacted")); n < rounds/2 {
		t.Fatalf("only %d compactions committed across %d kills", n, 2*rounds)
	}
	t.Logf("%d records over %d connections, each once; the longest lag of a live record behind its commit: %v", len(got), f.conns, f.maxLag)
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
