package turn

import (
	"context"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
)

// Policy is the turn loop's decision and transform slots: hooks.Dispatcher.
// Each answers the host's default when its hook is unbound or fails.
type Policy interface {
	PrepareTurn(ctx context.Context, session string, in hooks.PrepareTurnInput) hooks.TurnPrep
	NextAt(ctx context.Context, session string, pin *store.Pin, in hooks.NextInput) hooks.Next
	ReviewExecutionAt(ctx context.Context, session string, pin *store.Pin, in hooks.ExecutionInput) hooks.Decision
	PrepareContextAt(ctx context.Context, session string, pin *store.Pin, in hooks.ContextInput) []string
}

// prepare asks turn.prepare whether an attempt with inputs starts now. It
// returns when to look again if it is deferred (zero: start now, with the
// guidance it left in r.guidance). Deferrals are bounded: never with
// operator input, at most hooks.MaxDefersInARow in a row.
func (r *runner) prepare(ctx context.Context, inputs []store.PendingInput, wake string, now time.Time) time.Time {
	r.guidance = ""
	p := r.l.cfg.Policy
	if p == nil {
		return time.Time{}
	}
	operator := false
	for _, in := range inputs {
		operator = operator || in.SourceKind == "operator"
	}
	if !operator && now.Before(r.prepUntil) {
		return r.prepUntil // deferred already: not asked again before then
	}
	if r.prepDefers >= hooks.MaxDefersInARow {
		r.prepDefers, r.prepUntil = 0, time.Time{}
		return time.Time{}
	}
	in := hooks.PrepareTurnInput{Session: r.session, Wake: wake, Inputs: []hooks.TurnInputRef{}, Deferred: r.prepDefers}
	for _, it := range inputs {
		in.Inputs = append(in.Inputs, hooks.TurnInputRef{ID: it.ID, SourceKind: it.SourceKind, Directed: it.Directed, Conversation: it.Conversation})
	}
	dec := p.PrepareTurn(ctx, r.session, in)
	if dec.Defer > 0 {
		r.prepDefers++
		r.prepUntil = now.Add(dec.Defer)
		return r.prepUntil
	}
	r.prepDefers, r.prepUntil = 0, time.Time{}
	r.guidance = dec.Guidance
	return time.Time{}
}

// next asks turn.next what follows a step that ran cells; the budgets are
// enforced whatever it says (the loop checks them before every step).
func (r *runner) next(ctx context.Context, a *attempt, calls int) hooks.Next {
	p := r.l.cfg.Policy
	if p == nil {
		return hooks.Next{Decision: "continue"}
	}
	b := r.l.live().Budgets
	g, _ := r.l.cfg.Store.Glance(ctx, r.session)
	return p.NextAt(ctx, r.session, &a.pin, hooks.NextInput{Session: r.session, Attempt: a.id, Steps: a.steps, Tokens: a.tokens,
		Elapsed: r.l.cfg.Clock().Sub(a.started).Seconds(), Calls: calls, Pending: int(g.PendingOperator + g.PendingOther),
		Budgets: hooks.NextBudgets{MaxSteps: b.MaxSteps, MaxTokens: b.MaxTokens, MaxTurnSeconds: b.MaxTurn.Seconds()}})
}

// endByPolicy ends the attempt idle because turn.next said so.
func (r *runner) endByPolicy(ctx context.Context, a *attempt, reason string) error {
	r.clearBackoff()
	why := "idle: turn.next ended the attempt"
	if reason = strings.TrimSpace(reason); reason != "" {
		why += " (" + clip(reason, 200) + ")"
	}
	return r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		if err := tx.FinishAttempt(a.id, store.AttemptIdle, why); err != nil {
			return err
		}
		return tx.TransitionSession(r.session, store.StateRunning, store.StateReady, why)
	})
}

// reviewCell asks execution.review whether a cell runs; "" means it does,
// else the reason it is held.
func (r *runner) reviewCell(ctx context.Context, a *attempt, step int64, callID, code string) string {
	p := r.l.cfg.Policy
	if p == nil {
		return ""
	}
	dec := p.ReviewExecutionAt(ctx, r.session, &a.pin, hooks.ExecutionInput{Session: r.session, Code: code, Call: callID, Step: step, Attempt: a.id})
	if dec.Allow {
		return ""
	}
	reason := dec.Reason
	if !strings.HasPrefix(reason, "held") {
		reason = "held by execution.review: " + reason
	}
	return "not run: " + reason
}

// additions asks context.prepare for the next request's additions.
func (r *runner) additions(ctx context.Context, a *attempt) []string {
	p := r.l.cfg.Policy
	if p == nil {
		return nil
	}
	return p.PrepareContextAt(ctx, r.session, &a.pin, hooks.ContextInput{Session: r.session, Attempt: a.id, Step: a.steps, Additions: []string{}})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
