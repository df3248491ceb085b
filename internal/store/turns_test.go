package store

import (
	"errors"
	"testing"
	"time"
)

// A wait commits only when no input is ready, in the same transaction; its
// wakeup fires once, by input or by its deadline, never before it.
func TestWaitCommitAndWakeupFireOnce(t *testing.T) {
	s := newStore(t)
	ids := admitN(t, s, "default", "k1")
	var attempt int64
	mustWrite(t, s, func(tx *Tx) error {
		if err := tx.ClaimInputs("default", ids); err != nil {
			return err
		}
		frame, err := tx.TakeFrame(Frame{Session: "default", InputIDs: ids}, 0)
		if err != nil {
			return err
		}
		attempt, _, err = tx.StartAttempt(NewAttempt{Session: "default", Frame: frame, WakeReason: "input"})
		return err
	})
	// Input pending: the wait does not commit.
	admitN(t, s, "default", "k2")
	var woken bool
	mustWrite(t, s, func(tx *Tx) (err error) {
		woken, err = tx.CommitWait(Wait{Session: "default", Attempt: attempt, Reason: "r"})
		return err
	})
	if !woken {
		t.Fatal("a wait committed over pending input")
	}
	// The same input deferred by the plan: the wait commits.
	deadline := time.Now().Add(time.Hour)
	mustWrite(t, s, func(tx *Tx) (err error) {
		woken, err = tx.CommitWait(Wait{Session: "default", Attempt: attempt, Reason: "r", Deadline: &deadline,
			Ready: func([]PendingInput) bool { return false }})
		return err
	})
	if woken {
		t.Fatal("deferred input woke the wait")
	}
	if sess, _ := s.Session(t.Context(), "default"); sess.State != StateWaiting {
		t.Fatalf("state %s", sess.State)
	}
	var w *Wakeup
	mustWrite(t, s, func(tx *Tx) (err error) { w, err = tx.FireWakeup("default", "deadline"); return err })
	if w != nil {
		t.Fatal("a deadline fired an hour early")
	}
	mustWrite(t, s, func(tx *Tx) (err error) { w, err = tx.FireWakeup("default", "input"); return err })
	if w == nil || w.Reason != "r" {
		t.Fatalf("fired: %+v", w)
	}
	mustWrite(t, s, func(tx *Tx) (err error) { w, err = tx.FireWakeup("default", "input"); return err })
	if w != nil {
		t.Fatal("a wakeup fired twice")
	}
	if err := s.Write(t.Context(), func(tx *Tx) error { return tx.FinishAttempt(attempt, AttemptIdle, "again") }); !errors.Is(err, ErrNoAttempt) {
		t.Fatalf("a finished attempt finished again: %v", err)
	}
}

// A cell journaled for a call that the loop then answered itself (its
// Execute gave up) is still closed at the next start: recovery never
// refuses to start over an answered call.
func TestRecoverExecutionOfAnAnsweredCall(t *testing.T) {
	s := newStore(t)
	ids := admitN(t, s, "default", "k1")
	var step int64
	mustWrite(t, s, func(tx *Tx) error {
		if err := tx.ClaimInputs("default", ids); err != nil {
			return err
		}
		frame, err := tx.TakeFrame(Frame{Session: "default", InputIDs: ids}, 0)
		if err != nil {
			return err
		}
		attempt, _, err := tx.StartAttempt(NewAttempt{Session: "default", Frame: frame, WakeReason: "input"})
		if err != nil {
			return err
		}
		step, err = tx.RecordStep(StepResult{Session: "default", Attempt: attempt, Ordinal: 1, Started: time.Now(), Route: "r",
			State: "completed", Calls: []StepCall{{ID: "c1", Name: "python", Arguments: `{"code":"1"}`}}})
		if err != nil {
			return err
		}
		gen, err := tx.NextKernelGeneration("default", map[string]any{"pid": 1})
		if err != nil {
			return err
		}
		if _, _, err := tx.StartExecution("default", gen, "1", &ToolCall{Step: step, ID: "c1"}); err != nil {
			return err
		}
		return tx.CloseToolCall("default", step, "c1", ToolInterrupted, "not run: gave up")
	})
	var n int64
	mustWrite(t, s, func(tx *Tx) (err error) { n, err = tx.RecoverExecutions(); return err })
	if n != 1 {
		t.Fatalf("%d executions recovered, want 1", n)
	}
	err := s.Write(t.Context(), func(tx *Tx) error { return tx.AnswerToolCall("default", step, "c1", ToolDone, 1) })
	if !errors.Is(err, ErrCallAnswered) {
		t.Fatalf("answering an answered call: %v", err)
	}
}

// A generation has ended once a kernel.reset names it, and only that one.
func TestKernelGenerationEnded(t *testing.T) {
	s := newStore(t)
	admitN(t, s, "default", "k1")
	mustWrite(t, s, func(tx *Tx) error {
		for range 2 {
			if _, err := tx.NextKernelGeneration("default", nil); err != nil {
				return err
			}
		}
		return tx.KernelReset("default", 1, "reset")
	})
	for gen, want := range map[int64]bool{1: true, 2: false, 3: false} {
		if got, err := s.KernelGenerationEnded(t.Context(), "default", gen); err != nil || got != want {
			t.Fatalf("generation %d ended: %v %v; want %v", gen, got, err, want)
		}
	}
	if got, _ := s.KernelGenerationEnded(t.Context(), "other", 1); got {
		t.Fatal("another session's reset ends this one's generation")
	}
}
