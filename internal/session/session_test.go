package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

func newStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// The Go table and the schema trigger must agree on every pair of states.
func TestLifecycleMatchesSchema(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	for _, from := range store.States {
		for _, to := range store.States {
			if from == to {
				continue
			}
			t.Run(fmt.Sprintf("%s→%s", from, to), func(t *testing.T) {
				id := fmt.Sprintf("s-%s-%s", from, to)
				// Put a fresh session into from by a legal path (stopped and
				// paused are reachable from ready directly).
				err := st.Write(ctx, func(tx *store.Tx) error {
					if err := tx.CreateSession(id, ""); err != nil {
						return err
					}
					switch from {
					case store.StateReady:
						return nil
					case store.StateWaiting:
						if err := tx.TransitionSession(id, store.StateReady, store.StateRunning, ""); err != nil {
							return err
						}
						return tx.TransitionSession(id, store.StateRunning, store.StateWaiting, "")
					default:
						return tx.TransitionSession(id, store.StateReady, from, "")
					}
				})
				if err != nil {
					t.Fatalf("reach %s: %v", from, err)
				}
				goErr := CheckTransition(from, to)
				dbErr := st.Write(ctx, func(tx *store.Tx) error { return tx.TransitionSession(id, from, to, "test") })
				if (goErr == nil) != (dbErr == nil) {
					t.Fatalf("Go says %v, schema says %v", goErr, dbErr)
				}
				if dbErr != nil && !errors.Is(dbErr, store.ErrIllegalTransition) {
					t.Fatalf("schema refusal is not ErrIllegalTransition: %v", dbErr)
				}
				got, err := st.Session(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				want := from
				if goErr == nil {
					want = to
				}
				if got.State != want {
					t.Fatalf("state = %s, want %s", got.State, want)
				}
			})
		}
	}
}

func TestTransitionRecordsANoticeAndRefusesStaleState(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	m := NewManager(st)
	st.Write(ctx, func(tx *store.Tx) error { return tx.CreateSession("a", "") })
	if _, err := m.Transition(ctx, "a", store.StateRunning, "turn"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Transition(ctx, "a", store.StateRunning, "again"); !errors.Is(err, store.ErrIllegalTransition) {
		t.Fatalf("running→running: %v", err)
	}
	// A writer that read an old state is refused, not silently applied.
	err := st.Write(ctx, func(tx *store.Tx) error { return tx.TransitionSession("a", store.StateReady, store.StatePaused, "") })
	if !errors.Is(err, store.ErrStaleState) {
		t.Fatalf("stale from: %v", err)
	}
	if _, err := m.Transition(ctx, "nope", store.StateRunning, ""); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("unknown session: %v", err)
	}
	recs, err := st.Records(ctx, "a", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Lane != store.LaneNotice || recs[0].Kind != "session.running" {
		t.Fatalf("records = %+v, want one session.running notice", recs)
	}
}

func TestDrainWaitsForAcceptedWorkThenStops(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	m := NewManager(st)
	st.Write(ctx, func(tx *store.Tx) error { return tx.CreateSession("a", "") })
	done, err := m.Begin("a")
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { _, err := m.Drain(ctx, "a"); drained <- err }()

	// While draining, admission is closed with a clear error and no new work begins.
	deadline := time.Now().Add(5 * time.Second)
	for !m.Draining("a") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := m.CheckAdmission("a"); !errors.Is(err, ErrDraining) {
		t.Fatalf("admission while draining: %v", err)
	}
	if _, err := m.Begin("a"); !errors.Is(err, ErrDraining) {
		t.Fatalf("Begin while draining: %v", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("drain returned before the work finished: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	done()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	s, _ := st.Session(ctx, "a")
	if s.State != store.StateStopped {
		t.Fatalf("after drain: %s", s.State)
	}
	err = st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.AdmitInput(store.NewInput{Session: "a", SourceKind: "operator", SourceKey: "k", Conversation: "c", Author: "a", Body: "b", OccurredAt: time.Now(), ReceivedAt: time.Now()})
		return err
	})
	if err != nil {
		t.Fatalf("a stopped session still admits (the input waits for start): %v", err)
	}
	if s, _ := st.Session(ctx, "a"); !strings.Contains(Unanswered(s), "klbr-core start a") {
		t.Fatalf("unanswered note of a stopped session: %q", Unanswered(s))
	}
	if _, err := m.Transition(ctx, "a", store.StateReady, "start"); err != nil {
		t.Fatal(err)
	}
	if err := m.CheckAdmission("a"); err != nil {
		t.Fatalf("admission after start: %v", err)
	}
}

func TestShutdownRefusesNewWorkAndWaits(t *testing.T) {
	st := newStore(t)
	m := NewManager(st)
	done, _ := m.Begin("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := m.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with work in flight: %v", err)
	}
	if _, err := m.Begin("b"); !errors.Is(err, ErrDraining) {
		t.Fatalf("Begin after Shutdown: %v", err)
	}
	done()
	done() // idempotent
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
