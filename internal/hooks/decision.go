package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/store"
)

// releaseOf is the release an invocation under pin runs (nil: the
// session's pinned worker's, if one runs).
func (d *Dispatcher) releaseOf(session string, pin *store.Pin) string {
	if pin != nil && pin.Release != "" {
		return pin.Release
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.pinned[session]; p != nil {
		return p.release
	}
	return ""
}

// bound reports whether handler may be asked under release: false once the
// release's worker said it has no such handler (optional slots).
func (d *Dispatcher) bound(release, handler string) bool {
	if release == "" {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.absent[release+"\x00"+handler]
}

// noteAbsent remembers that c's release has no handler.
func (d *Dispatcher) noteAbsent(c *call, handler string) bool {
	if c.rec.Outcome == "error" && c.rec.Release != "" && strings.Contains(c.rec.Error, ": UnknownSlot: ") {
		d.mu.Lock()
		d.absent[c.rec.Release+"\x00"+handler] = true
		d.mu.Unlock()
		return true
	}
	return false
}

// decide runs an optional decision slot: nil when the release does not bind
// it (the caller applies its default), else the invocation, not yet
// finished; problem says why its answer cannot be used ("" when it can).
func (d *Dispatcher) decide(ctx context.Context, session string, pin *store.Pin, slot string, in any, check func(json.RawMessage) error) (c *call, problem string) {
	rel := d.releaseOf(session, pin)
	if !d.bound(rel, slot) {
		d.stats.skip(slot)
		return nil, ""
	}
	s, _ := Lookup(slot)
	c = d.invokeAt(ctx, session, pin, slot, in, s.Deadline)
	switch {
	case c.rec.Outcome != "ok":
		if d.noteAbsent(c, slot) {
			problem = slot + " is not bound by the release"
		} else {
			problem = fmt.Sprintf("%s %s: %s", slot, c.rec.Outcome, c.rec.Error)
		}
	default:
		if err := check(c.result); err != nil {
			problem, c.rec.Outcome = err.Error(), "invalid"
		}
	}
	if problem != "" {
		c.rec.Error, c.rec.Fallback = problem, true
	}
	return c, problem
}

// TurnInputRef is an input an attempt would take in.
type TurnInputRef struct {
	ID           int64  `json:"id"`
	SourceKind   string `json:"source_kind"`
	Directed     bool   `json:"directed"`
	Conversation string `json:"conversation"`
}

// PrepareTurnInput is what turn.prepare decides on.
type PrepareTurnInput struct {
	Session string         `json:"session"`
	Wake    string         `json:"wake"`
	Inputs  []TurnInputRef `json:"inputs"`
	// Deferred counts the times in a row this start was deferred already.
	Deferred int `json:"deferred"`
}

// TurnPrep is turn.prepare's answer as the host applies it.
type TurnPrep struct {
	Defer    time.Duration // 0: start now
	Guidance string        // a model-visible note the attempt starts with
	Reason   string
	Fallback bool
}

// Bounds of turn.prepare.
const (
	MaxTurnDefer    = 300 * time.Second
	MaxGuidance     = 4000
	MaxDefersInARow = 3
)

func decodeTurnPrep(in PrepareTurnInput, out json.RawMessage) (TurnPrep, error) {
	var r struct {
		Decision *string  `json:"decision"`
		Seconds  *float64 `json:"seconds"`
		Guidance string   `json:"guidance"`
		Reason   string   `json:"reason"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Decision == nil {
		return TurnPrep{}, fmt.Errorf("turn.prepare answered %s, not {decision, seconds, guidance, reason}", truncate(out))
	}
	p := TurnPrep{Reason: r.Reason}
	if len(r.Guidance) > MaxGuidance || !utf8.ValidString(r.Guidance) {
		return p, fmt.Errorf("turn.prepare guidance is %d bytes (at most %d of UTF-8)", len(r.Guidance), MaxGuidance)
	}
	p.Guidance = r.Guidance
	switch *r.Decision {
	case "start":
	case "defer":
		for _, it := range in.Inputs {
			if it.SourceKind == "operator" {
				return p, fmt.Errorf("turn.prepare deferred operator input %d", it.ID)
			}
		}
		if r.Seconds == nil || *r.Seconds <= 0 || *r.Seconds > MaxTurnDefer.Seconds() {
			return p, fmt.Errorf("turn.prepare deferred without seconds in (0, %g]", MaxTurnDefer.Seconds())
		}
		p.Defer = time.Duration(*r.Seconds * float64(time.Second))
	default:
		return p, fmt.Errorf("turn.prepare decided %q, neither start nor defer", *r.Decision)
	}
	return p, nil
}

// PrepareTurn runs turn.prepare for an attempt about to start under the
// session's active behavior. Failing, slow or nonsensical: start now.
func (d *Dispatcher) PrepareTurn(ctx context.Context, session string, in PrepareTurnInput) TurnPrep {
	var p TurnPrep
	c, problem := d.decide(ctx, session, nil, SlotTurnPrepare, in, func(out json.RawMessage) (err error) {
		p, err = decodeTurnPrep(in, out)
		return err
	})
	if c == nil {
		return TurnPrep{Reason: "host default: start now"}
	}
	if problem != "" {
		p = TurnPrep{Reason: "host default: start now (" + problem + ")", Fallback: true}
	}
	d.finish(c)
	return p
}

// NextBudgets are the attempt's budgets, for turn.next.
type NextBudgets struct {
	MaxSteps       int     `json:"max_steps"`
	MaxTokens      int     `json:"max_tokens"`
	MaxTurnSeconds float64 `json:"max_turn_seconds"`
}

// NextInput is what turn.next decides on, after a step that ran cells.
type NextInput struct {
	Session string      `json:"session"`
	Attempt int64       `json:"attempt"`
	Steps   int         `json:"steps"`
	Tokens  int         `json:"tokens"`
	Elapsed float64     `json:"elapsed_seconds"`
	Calls   int         `json:"calls"`
	Pending int         `json:"pending"`
	Budgets NextBudgets `json:"budgets"`
}

// Next is turn.next's answer.
type Next struct {
	Decision string   // continue, wait or end
	Seconds  *float64 // wait: until input when nil
	Reason   string
	Fallback bool
}

// MaxNextWait bounds a wait turn.next asks for.
const MaxNextWait = 600.0

func decodeNext(out json.RawMessage) (Next, error) {
	var r struct {
		Decision *string  `json:"decision"`
		Seconds  *float64 `json:"seconds"`
		Reason   string   `json:"reason"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Decision == nil {
		return Next{}, fmt.Errorf("turn.next answered %s, not {decision, seconds, reason}", truncate(out))
	}
	n := Next{Decision: *r.Decision, Reason: r.Reason}
	switch n.Decision {
	case "continue", "end":
	case "wait":
		if r.Seconds != nil && (*r.Seconds <= 0 || *r.Seconds > MaxNextWait) {
			return n, fmt.Errorf("turn.next asked to wait %v s, outside (0, %g]", *r.Seconds, MaxNextWait)
		}
		n.Seconds = r.Seconds
	default:
		return n, fmt.Errorf("turn.next decided %q, not continue, wait or end", n.Decision)
	}
	return n, nil
}

// NextAt runs turn.next under the running attempt's behavior (pin).
// Failing, slow or nonsensical: continue.
func (d *Dispatcher) NextAt(ctx context.Context, session string, pin *store.Pin, in NextInput) Next {
	var n Next
	c, problem := d.decide(ctx, session, pin, SlotTurnNext, in, func(out json.RawMessage) (err error) {
		n, err = decodeNext(out)
		return err
	})
	if c == nil {
		return Next{Decision: "continue", Reason: "host default: continue"}
	}
	if problem != "" {
		n = Next{Decision: "continue", Reason: "host default: continue (" + problem + ")", Fallback: true}
	}
	d.finish(c)
	return n
}

// ExecutionInput is what execution.review judges.
type ExecutionInput struct {
	Session string `json:"session"`
	Code    string `json:"code"`
	Call    string `json:"call"`
	Step    int64  `json:"step"`
	Attempt int64  `json:"attempt"`
}

func decodeVerdict(slot string, out json.RawMessage) (allow bool, reason string, err error) {
	var r struct {
		Decision *string `json:"decision"`
		Reason   *string `json:"reason"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Decision == nil || r.Reason == nil {
		return false, "", fmt.Errorf("%s answered %s, not {decision, reason}", slot, truncate(out))
	}
	switch *r.Decision {
	case "allow":
		return true, *r.Reason, nil
	case "hold":
		return false, *r.Reason, nil
	}
	return false, "", fmt.Errorf("%s decided %q, which is neither allow nor hold", slot, *r.Decision)
}

// ReviewExecutionAt runs execution.review before a cell runs, under the
// cell's behavior (pin). A failing, slow or nonsensical hook allows the
// cell, unless the release lists execution.review in [hooks] required: then
// it holds (fails closed). A release that requires it but does not bind it
// holds every cell.
func (d *Dispatcher) ReviewExecutionAt(ctx context.Context, session string, pin *store.Pin, in ExecutionInput) Decision {
	required := d.binding(d.releaseOf(session, pin)).IsRequired(SlotExecutionReview)
	var dec Decision
	c, problem := d.decide(ctx, session, pin, SlotExecutionReview, in, func(out json.RawMessage) (err error) {
		dec.Allow, dec.Reason, err = decodeVerdict(SlotExecutionReview, out)
		return err
	})
	switch {
	case c == nil && required:
		return Decision{Reason: "held: the release requires execution.review and does not bind it", Fallback: true}
	case c == nil:
		return Decision{Allow: true, Reason: "host default: allow"}
	}
	dec.Release, dec.Epoch = c.rec.Release, c.rec.Epoch
	if problem != "" {
		dec.Fallback = true
		if required {
			dec.Allow, dec.Reason = false, "held: execution.review is required and did not decide ("+problem+")"
		} else {
			dec.Allow, dec.Reason = true, "host default: allow ("+problem+")"
		}
	}
	d.finish(c)
	return dec
}
