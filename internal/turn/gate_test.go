package turn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// gateModel is the provider's stand-in: a child's request holds until
// released or cancelled; a root's is answered at once.
type gateModel struct {
	mu       sync.Mutex
	arrived  map[string]int
	inFlight map[string]int
	release  chan struct{}
	empty    bool // children answer empty completions (the attempt goes on)
}

func (m *gateModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	s := req.Meta.Session
	m.mu.Lock()
	m.arrived[s]++
	m.inFlight[s]++
	m.mu.Unlock()
	defer func() { m.mu.Lock(); m.inFlight[s]--; m.mu.Unlock() }()
	if strings.HasPrefix(s, "child-") {
		select {
		case <-m.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	one, text := 10, "done"
	if m.empty && strings.HasPrefix(s, "child-") {
		text = ""
	}
	return &provider.Response{Content: text, Usage: provider.Usage{PromptTokens: &one, CompletionTokens: &one}}, nil
}

func (m *gateModel) count(s string) (arrived, inFlight int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.arrived[s], m.inFlight[s]
}

func newGateLoop(t *testing.T, m Model, slots *Slots, check func(context.Context, string) error) (*Loop, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := New(Config{Store: st, Sessions: session.NewManager(st), Model: m, Route: "main", Slots: slots, Check: check,
		Prompt:  func(context.Context, string) (string, error) { return "You are a test.", nil },
		Budgets: Budgets{MaxSteps: 10, MaxTokens: 1 << 30, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3, ContextTokens: 1 << 30}})
	t.Cleanup(l.Close)
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	return l, st
}

func spawnChildren(t *testing.T, st *store.Store, n int) []string {
	t.Helper()
	var out []string
	for range n {
		if err := st.Write(context.Background(), func(tx *store.Tx) error {
			sp, err := tx.SpawnChild(store.NewChild{Parent: "default", Task: "hold a slot"})
			out = append(out, sp.Session)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func operatorSays(t *testing.T, st *store.Store, text string) {
	t.Helper()
	now := time.Now()
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		_, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator", SourceKey: text, Conversation: "operator",
			Author: "operator", Directed: true, OccurredAt: now, ReceivedAt: now, Body: text})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// With model_slots = 3, three children ask at once: two hold the slots
// children may have, the third waits (its status says so, the model never
// sees it); the root's request still goes out at once. Stopping the
// waiting child ends its wait without a request.
func TestChildrenNeverTakeTheRootsSlot(t *testing.T) {
	m := &gateModel{arrived: map[string]int{}, inFlight: map[string]int{}, release: make(chan struct{})}
	slots := NewSlots(3)
	l, st := newGateLoop(t, m, slots, nil)
	kids := spawnChildren(t, st, 3)
	for _, k := range kids {
		l.Start(k, false)
	}
	eventually(t, "two children in requests, one waiting", func() bool {
		s := slots.Stats()
		return s.Children == 2 && s.WaitingChildren == 1
	})
	var waiting string
	for _, k := range kids {
		if n, _ := m.count(k); n == 0 {
			waiting = k
		}
	}
	if st := l.Backoffs()[waiting]; st.State != RetryWaitingSlot || !strings.Contains(st.LastError, "model_slots") {
		t.Fatalf("the waiting child's status: %+v", st)
	}
	l.Start("default", false)
	operatorSays(t, st, "hello")
	eventually(t, "the root's request was answered", func() bool { n, _ := m.count("default"); return n >= 1 })
	if s := slots.Stats(); s.Children != 2 || s.WaitingChildren != 1 {
		t.Fatalf("slots %+v while the root asked", s)
	}
	// Stopping the waiting child ends its wait: no request is ever sent.
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		s, err := tx.Session(waiting)
		if err != nil {
			return err
		}
		return tx.TransitionSession(waiting, s.State, store.StateStopped, "test")
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stopped child left the queue", func() bool { return slots.Stats().WaitingChildren == 0 })
	close(m.release)
	eventually(t, "the children's slots were given back", func() bool { s := slots.Stats(); return s.Children == 0 && s.Roots == 0 })
	if n, _ := m.count(waiting); n != 0 {
		t.Fatalf("the stopped child sent %d requests", n)
	}
}

// Check is asked before each request of a child, never of a root; its
// error keeps the request from being sent and ends the attempt with it.
func TestCheckRefusesAChildsRequest(t *testing.T) {
	m := &gateModel{arrived: map[string]int{}, inFlight: map[string]int{}, release: make(chan struct{}), empty: true}
	close(m.release)
	var mu sync.Mutex
	asked := map[string]int{}
	spent := errors.New("budget exhausted: model requests 1 of 1 (budget.model_requests)")
	check := func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		asked[s]++
		if asked[s] > 1 {
			return spent
		}
		return nil
	}
	l, st := newGateLoop(t, m, NewSlots(2), check)
	kid := spawnChildren(t, st, 1)[0]
	l.Start(kid, false)
	l.Start("default", false)
	operatorSays(t, st, "hello")
	// The outcome is read with the state that ended it: a later attempt
	// may already have begun by the time a second read would run.
	var outcome string
	eventually(t, "the child's attempt ended", func() bool {
		turn, err := st.Turn(context.Background(), kid)
		if err != nil || turn.Attempt == nil || turn.Attempt.State != store.AttemptInterrupted {
			return false
		}
		outcome = turn.Attempt.Outcome
		return true
	})
	if !strings.Contains(outcome, "no model request: budget exhausted") {
		t.Fatalf("outcome %q", outcome)
	}
	if n, _ := m.count(kid); n != 1 {
		t.Fatalf("the child sent %d requests, want 1", n)
	}
	eventually(t, "the root was answered", func() bool { n, _ := m.count("default"); return n >= 1 })
	mu.Lock()
	defer mu.Unlock()
	// The root is never asked; the child at least twice (a later attempt
	// may ask again, and is refused again: its requests stay at 1).
	if asked["default"] != 0 || asked[kid] < 2 {
		t.Fatalf("asked %v", fmt.Sprint(asked))
	}
	if n, _ := m.count(kid); n != 1 {
		t.Fatalf("the child sent %d requests after its refusal, want 1", n)
	}
}
