package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func record(t *testing.T, s *Store, slot, text string, outcome string) {
	t.Helper()
	in := json.RawMessage(fmt.Sprintf(`{"text": %q}`, text))
	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordHookInvocation(HookInvocation{Session: "default", Slot: slot, Release: "r", Epoch: 1,
			InputDigest: "d-" + slot + "-" + text, Outcome: outcome, Result: json.RawMessage(`{"decision": "allow", "reason": ""}`),
			Latency: time.Millisecond, Input: in})
	})
}

// Inputs are kept for replay, bounded per slot; replayable invocations come
// newest first; an input over the bound is recorded by digest only.
func TestHookInputsReplayAndPrune(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for i := range 5 {
		record(t, s, "delivery.review", fmt.Sprintf("m%d", i), "ok")
	}
	record(t, s, "delivery.review", "failed", "error")
	record(t, s, "attention.plan", "rare", "ok")
	record(t, s, "delivery.review", strings.Repeat("x", MaxHookInput), "ok")
	recs, err := s.ReplayableInvocations(ctx, "default", "delivery.review", 10)
	if err != nil || len(recs) != 5 || !strings.Contains(string(recs[0].Input), "m4") {
		t.Fatalf("replayable: %d %v", len(recs), err)
	}
	tr, err := s.HookTrace(ctx, "default", 2, false)
	if err != nil || len(tr) != 2 || tr[0].InputKept || tr[1].Slot != "attention.plan" || !tr[1].InputKept || tr[1].Input != nil {
		t.Fatalf("trace: %+v %v", tr, err)
	}
	time.Sleep(2 * time.Millisecond)
	record(t, s, "delivery.review", "m5", "ok")
	record(t, s, "delivery.review", "m6", "ok")
	var n int64
	mustWrite(t, s, func(tx *Tx) (err error) {
		n, err = tx.PruneHookInputs([]string{"delivery.review", "attention.plan"}, 2)
		return err
	})
	recs, _ = s.ReplayableInvocations(ctx, "default", "delivery.review", 10)
	if n == 0 || len(recs) != 2 {
		t.Fatalf("pruned %d, %d replayable left, want the newest 2", n, len(recs))
	}
	if plan, _ := s.ReplayableInvocations(ctx, "default", "attention.plan", 10); len(plan) != 1 {
		t.Fatal("a rare slot lost its input to a busy one")
	}

	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordValidation("default", "rel", false, json.RawMessage(`{"ok": false}`))
	})
	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordValidation("default", "rel", true, json.RawMessage(`{"ok": true}`))
	})
	if v, err := s.ReleaseValidation(ctx, "", "rel"); err != nil || !v.OK || string(v.Report) != `{"ok": true}` {
		t.Fatalf("validation: %+v %v", v, err)
	}
	if _, err := s.ReleaseValidation(ctx, "default", "other"); err == nil {
		t.Fatal("a report for a release never validated")
	}
}
