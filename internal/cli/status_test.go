package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// Two sessions failing the same way: the error is printed once, with its
// fix; the second session names the first; each attempt line points below.
func TestStatusSaysASharedErrorOnce(t *testing.T) {
	const boom = `dial tcp 127.0.0.1:1: connect: connection refused`
	ss := []api.SessionStatus{}
	for _, id := range []string{"default", "child-1"} {
		ss = append(ss, api.SessionStatus{Session: store.Session{ID: id, State: store.StateRunning},
			TurnStatus: store.TurnStatus{Attempt: &store.AttemptInfo{ID: 3, State: "failed", WakeReason: "resumed: the last attempt ended failed (model request failed; " + boom + ")",
				Outcome: "model request failed (route main); retrying in 2s: " + boom}},
			Retry: &turn.Retry{State: "retrying", InARow: 3, LastError: boom, LastErrorAt: time.Now(), Fix: "start the model server"}})
	}
	var out bytes.Buffer
	printSessions(&globals{env: Env{Stdout: &out}}, ss)
	s := out.String()
	if n := strings.Count(s, boom); n != 1 {
		t.Errorf("the error is printed %d times, want once:\n%s", n, s)
	}
	if n := strings.Count(s, "fix: start the model server"); n != 1 {
		t.Errorf("the fix is printed %d times, want once:\n%s", n, s)
	}
	if !strings.Contains(s, "child-1 retrying by itself") || !strings.Contains(s, "the same error as default") ||
		!strings.Contains(s, "resumed: the last attempt ended failed (the error below)") {
		t.Errorf("status:\n%s", s)
	}
}
