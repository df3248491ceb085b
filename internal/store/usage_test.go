package store

import (
	"errors"
	"testing"
	"time"
)

// A session's usage sums its own model steps, whatever their state, and
// nothing of another session's.
func TestSessionUsageSumsTheSessionsSteps(t *testing.T) {
	s := newStore(t)
	sp, err := spawn(t, s, NewChild{Parent: "default", Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := s.SessionUsage(t.Context(), sp.Session); err != nil || u.ModelRequests != 0 || u.Tokens != 0 {
		t.Fatalf("a fresh child's usage %+v, %v", u, err)
	}
	n := func(i int) *int { return &i }
	mustWrite(t, s, func(tx *Tx) error {
		attempt, _, err := tx.StartAttempt(NewAttempt{Session: sp.Session, WakeReason: "input"})
		if err != nil {
			return err
		}
		for i, st := range []StepResult{
			{State: "completed", Text: "a", Usage: StepUsage{Prompt: n(10), Completion: n(5), CacheRead: n(100)}},
			{State: "failed", Error: "down"},
			{State: "completed", Text: "b", Usage: StepUsage{Prompt: n(7)}},
		} {
			st.Session, st.Attempt, st.Ordinal, st.Started, st.Route = sp.Session, attempt, i+1, time.Now(), "r"
			if _, err := tx.RecordStep(st); err != nil {
				return err
			}
		}
		return nil
	})
	u, err := s.SessionUsage(t.Context(), sp.Session)
	if err != nil || u.ModelRequests != 3 || u.Tokens != 22 || u.Attempts != 1 || u.Session != sp.Session {
		t.Fatalf("the child's usage %+v, %v; want 3 requests, 22 tokens, 1 attempt", u, err)
	}
	if u, err := s.SessionUsage(t.Context(), "default"); err != nil || u.ModelRequests != 0 || u.Tokens != 0 {
		t.Fatalf("the root's usage %+v, %v; want none", u, err)
	}
	if _, err := s.SessionUsage(t.Context(), "nobody"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("an unknown session's usage: %v", err)
	}
}
