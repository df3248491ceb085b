package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/worker"
)

// CheckCandidate has a candidate release's hook worker answer: every
// required slot's fixture well; every optional decision slot it binds, too
// (one it does not bind gets the host's default); each observer its [hooks]
// table names must exist. tree is the release's.
func CheckCandidate(ctx context.Context, w *worker.Worker, tree string) error {
	b, err := ReadBinding(tree)
	if err != nil {
		return err
	}
	ask := func(handler string, in any) (json.RawMessage, error) {
		raw, _ := json.Marshal(in)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return w.Invoke(cctx, handler, raw)
	}
	for _, s := range registry {
		if s.Kind != KindDecision || s.Fixture == nil {
			continue
		}
		out, err := ask(s.Name, s.Fixture)
		if err != nil && s.Optional && strings.Contains(err.Error(), "UnknownSlot") && !b.IsRequired(s.Name) {
			continue
		}
		if err == nil {
			err = CheckResult(s.Name, s.Fixture, out)
		}
		if err != nil {
			return fmt.Errorf("%s: %v", s.Name, err)
		}
	}
	// A transform handler SLOTS lacks is skipped at run time (recorded),
	// like one that fails: a release that drops a default handler still
	// activates.
	for _, o := range b.Observers {
		// Not called (observers act on real events); only looked up, with an
		// input no handler is meant to accept.
		if _, err := ask(o.Handler, map[string]any{"check": true}); err != nil && strings.Contains(err.Error(), "UnknownSlot") {
			return fmt.Errorf("observer %s is not in klbr_hooks.SLOTS", o.Handler)
		}
	}
	return nil
}

// Validate checks out, a handler's answer to input (JSON) for slot, as the
// host would before using it (hooks.test reports it). Transforms and
// observers are checked for their shape.
func Validate(slot string, input, out json.RawMessage) error {
	s, ok := Lookup(slot)
	if !ok {
		return fmt.Errorf("unknown slot %q", slot)
	}
	switch s.Kind {
	case KindObserver:
		_, err := decodeAnswer(out)
		return err
	case KindTransform:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil {
			return fmt.Errorf("answered %s, not an object", truncate(out))
		}
		key := map[string]string{SlotContextPrepare: "additions", SlotDeliveryPrepare: "parts", SlotResultPresent: "text"}[slot]
		if _, ok := m[key]; !ok {
			return fmt.Errorf("answered %s, without %q", truncate(out), key)
		}
		return nil
	}
	var typed any
	switch slot {
	case SlotPlan:
		var in PlanInput
		err := json.Unmarshal(input, &in)
		typed = in
		if err != nil {
			return fmt.Errorf("input: %v", err)
		}
	case SlotModelPlan:
		var in provider.PlanInput
		if err := json.Unmarshal(input, &in); err != nil {
			return fmt.Errorf("input: %v", err)
		}
		typed = in
	case SlotCompactionPlan:
		var in CompactionInput
		if err := json.Unmarshal(input, &in); err != nil {
			return fmt.Errorf("input: %v", err)
		}
		typed = in
	case SlotTurnPrepare:
		var in PrepareTurnInput
		json.Unmarshal(input, &in)
		typed = in
	}
	return CheckResult(slot, typed, out)
}
