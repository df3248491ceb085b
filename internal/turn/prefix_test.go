package turn

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// requestBytes is each message of a request as the provider sends it.
func requestBytes(t *testing.T, msgs []provider.Message) []string {
	t.Helper()
	out := make([]string, len(msgs))
	for i, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(b)
	}
	return out
}

// extends fails unless next repeats prev byte for byte and adds to it.
func extends(t *testing.T, prev, next []string) {
	t.Helper()
	if len(next) < len(prev) {
		t.Fatalf("the request shrank from %d to %d messages", len(prev), len(next))
	}
	for i := range prev {
		if prev[i] != next[i] {
			t.Fatalf("message %d of %d changed:\n%s\n→\n%s", i, len(prev), prev[i], next[i])
		}
	}
}

// A request carried a call without its result (it was still open); the
// result recorded after a later notice does not rewrite the tool message
// that request carried: the next request extends it, and the result
// follows the history, naming its call.
func TestLateResultKeepsThePrefix(t *testing.T) {
	l, st := newGateLoop(t, &gateModel{arrived: map[string]int{}, inFlight: map[string]int{}}, nil, nil)
	ctx := context.Background()
	var attempt, step int64
	if err := st.Write(ctx, func(tx *store.Tx) (err error) {
		if attempt, _, err = tx.StartAttempt(store.NewAttempt{Session: "default", WakeReason: "input"}); err != nil {
			return err
		}
		step, err = tx.RecordStep(store.StepResult{Session: "default", Attempt: attempt, Ordinal: 1, Started: time.Now(), State: "completed",
			Route: "main", Text: "working", Calls: []store.StepCall{{ID: "a", Name: "python", Arguments: `{"code":"1"}`}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r := &runner{l: l, session: "default"}
	s, err := st.Session(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	s.PolicyRevision = "r"
	first, _, err := r.assemble(ctx, s, s.ContextEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if got := first[len(first)-1]; got.Role != "tool" || got.Content != noResult {
		t.Fatalf("the open call's message: %+v", got)
	}
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if _, err := tx.Notice("default", "wait.woken", map[string]any{"by": "input"}, true); err != nil {
			return err
		}
		return tx.CloseToolCall("default", step, "a", store.ToolInterrupted, "the late result")
	}); err != nil {
		t.Fatal(err)
	}
	second, _, err := r.assemble(ctx, s, s.ContextEpoch)
	if err != nil {
		t.Fatal(err)
	}
	extends(t, requestBytes(t, first), requestBytes(t, second))
	last := second[len(second)-1]
	if last.Role != "user" || !strings.Contains(last.Content, `call "a"`) || !strings.Contains(last.Content, "the late result") {
		t.Fatalf("the late result is not after the history: %+v", second[len(first):])
	}
}
