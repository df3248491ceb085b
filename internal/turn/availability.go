package turn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// Availability is not a loop guard. A route that fails transiently is
// retried with capped backoff for as long as it takes; a request the route
// rejects, and a loop guard, end the attempt and return the session to
// ready, where the next input starts a new attempt, no sooner than the same
// backoff. Only an operator's stop or pause waits for a person.

// Retry states a session's backoff shows in status.
const (
	// RetryRetrying: a transient failure; the session retries by itself at NextAt.
	RetryRetrying = "retrying"
	// RetryBackingOff: the last attempt was rejected by the route or ended
	// by a loop guard; the next input starts an attempt, not before NextAt.
	RetryBackingOff = "backing_off"
	// RetryWaitingSlot: a child agent's model request waits for a model
	// slot ([agents] model_slots); it is sent as soon as one is free.
	RetryWaitingSlot = "waiting_for_slot"
)

// Retry is a session's backoff, as status, the browser and /metrics show it.
type Retry struct {
	State string `json:"state"` // RetryRetrying or RetryBackingOff
	// NextAt is the earliest time of the next attempt.
	NextAt time.Time `json:"next_at"`
	// InARow counts the failures (or ended attempts) of this backoff.
	InARow int `json:"in_a_row"`
	// The last error, when it happened, and the route it was sent to.
	LastError   string    `json:"last_error"`
	LastErrorAt time.Time `json:"last_error_at"`
	Route       string    `json:"route,omitempty"`
	URL         string    `json:"url,omitempty"`
	// Fix names the likely fix of an error retrying cannot fix.
	Fix string `json:"fix,omitempty"`
}

// Retry returns session's backoff, or nil when it has none.
func (l *Loop) Retry(session string) *Retry {
	l.mu.Lock()
	r := l.runners[session]
	l.mu.Unlock()
	if r == nil {
		return nil
	}
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	if r.status == nil {
		return nil
	}
	s := *r.status
	return &s
}

// Backoffs returns every session's backoff, by session.
func (l *Loop) Backoffs() map[string]Retry {
	l.mu.Lock()
	rs := make([]*runner, 0, len(l.runners))
	for _, r := range l.runners {
		rs = append(rs, r)
	}
	l.mu.Unlock()
	out := map[string]Retry{}
	for _, r := range rs {
		r.statusMu.Lock()
		if r.status != nil {
			out[r.session] = *r.status
		}
		r.statusMu.Unlock()
	}
	return out
}

func (r *runner) setStatus(s *Retry) {
	r.statusMu.Lock()
	r.status = s
	r.statusMu.Unlock()
}

// backoff is the wait before the n-th try of a chain (n ≥ 1):
// agent.retry_backoff_ms doubled per failure, capped at
// agent.max_retry_backoff_ms, with jitter in its upper half so that
// sessions failing together do not retry together.
func (b Budgets) backoff(n int) time.Duration {
	d := b.MaxBackoff
	if n < 1 {
		n = 1
	}
	if f := float64(b.ErrorBackoff) * math.Pow(2, float64(n-1)); f < float64(b.MaxBackoff) {
		d = time.Duration(f)
	}
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// clearBackoff forgets the backoff: an attempt ended well (idle or waiting).
func (r *runner) clearBackoff() {
	r.failures, r.strikes, r.noResume, r.directedOnly = 0, 0, false, false
	r.retryAt = time.Time{}
	r.setStatus(nil)
}

// fixFor names the likely fix of an error retrying cannot fix.
func (r *runner) fixFor(err error) string {
	route := r.l.live().Route
	var pe *provider.Error
	if errors.As(err, &pe) && pe.Kind == provider.KindHTTP {
		switch pe.Status {
		case 401, 403:
			return fmt.Sprintf("the route refused the API key: check routes.%s.api_key_env or api_key_file, then restart klbr-core", route)
		case 404:
			return fmt.Sprintf("the route has no such endpoint or model: check routes.%s.url (it ends in /v1) and routes.%s.model", route, route)
		case 400, 413, 422:
			return fmt.Sprintf("the route refused the request: check routes.%s.model and extra_options, or reset the context if it is too long", route)
		}
		return fmt.Sprintf("the route answered HTTP %d: check routes.%s", pe.Status, route)
	}
	if errors.Is(err, errBadCalls) {
		return "the model's tool calls cannot be answered; a new input starts a new attempt"
	}
	return fmt.Sprintf("the route's answers are not OpenAI-compatible: check routes.%s.url", route)
}

// modelFailed ends an attempt whose model request failed. A transient
// failure is retried as a new attempt after a backoff, for as long as it
// takes; an error retrying cannot fix ends the attempt with a notice that
// names the likely fix, and the session returns to ready. Either way the
// inputs stay where they are: consumed by their frame, in the context the
// next attempt sends.
func (r *runner) modelFailed(ctx context.Context, a *attempt, step int64, reqErr error) error {
	cfg := &r.l.cfg
	now := cfg.Clock()
	kind := "error"
	var pe *provider.Error
	if errors.As(reqErr, &pe) {
		kind = pe.Kind.String()
	}
	if errors.Is(reqErr, errBadCalls) {
		kind = "invalid response"
	}
	transient := provider.IsRetryable(reqErr)
	st := &Retry{LastError: reqErr.Error(), LastErrorAt: now, Route: r.l.live().Route, URL: r.l.live().URL}
	notice := map[string]any{"attempt": a.id, "step": step, "kind": kind, "message": reqErr.Error(),
		"route": r.l.live().Route, "url": r.l.live().URL, "model": r.l.live().ModelName, "transient": transient}
	addProviderDetail(notice, reqErr) // the route that failed, its URL and its own message, when the error knows them
	if pe != nil && pe.Route != "" && pe.Route != r.l.live().Route {
		// A fallback route failed: name it, with the URL it was sent to.
		st.Route, st.URL = pe.Route, pe.URL
		notice["url"] = pe.URL
	}
	var wait time.Duration
	if transient {
		r.failures++
		wait = r.l.live().Budgets.backoff(r.failures)
		if pe != nil && pe.RetryAfter > wait {
			wait = min(pe.RetryAfter, r.l.live().Budgets.MaxBackoff) // the route's Retry-After, within the cap
		}
		st.State, st.InARow = RetryRetrying, r.failures
	} else {
		r.strikes++
		r.noResume, r.directedOnly = true, true
		wait = r.l.live().Budgets.backoff(r.strikes)
		st.State, st.InARow, st.Fix = RetryBackingOff, r.strikes, r.fixFor(reqErr)
		notice["fix"] = st.Fix
	}
	r.retryAt = now.Add(wait)
	st.NextAt = r.retryAt
	notice["errors_in_a_row"], notice["retry_in_ms"], notice["retry_at"] = st.InARow, wait.Milliseconds(), r.retryAt
	if err := cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		_, err := tx.Notice(r.session, "model.error", notice, false)
		return err
	}); err != nil {
		return err
	}
	r.setStatus(st)
	where := fmt.Sprintf("route %s, %s, at %s", r.l.live().Route, r.l.live().URL, now.UTC().Format(time.RFC3339))
	if transient {
		return r.finish(a, store.AttemptFailed, fmt.Sprintf("model request failed (%s); retrying in %s: %s",
			where, wait.Round(time.Millisecond), reqErr))
	}
	return r.end(ctx, a, store.AttemptFailed, fmt.Sprintf("model request rejected (%s): %s; %s", where, reqErr, st.Fix), nil)
}

// guard ends an attempt a loop guard stopped (a budget, empty completions,
// cells that cannot run): a visible notice, the session back to ready, and
// a backoff before the next attempt, so that a loop spanning attempts slows
// down instead of stopping forever.
func (r *runner) guard(ctx context.Context, a *attempt, reason string) error {
	now := r.l.cfg.Clock()
	r.strikes++
	r.noResume = true
	wait := r.l.live().Budgets.backoff(r.strikes)
	r.retryAt = now.Add(wait)
	r.setStatus(&Retry{State: RetryBackingOff, NextAt: r.retryAt, InARow: r.strikes, LastError: reason, LastErrorAt: now,
		Fix: "the next input starts a new attempt"})
	return r.end(ctx, a, store.AttemptIdle, "ended: "+reason, map[string]any{"attempt": a.id, "reason": reason,
		"message": "the attempt was ended by a loop guard; the next input starts a new attempt", "next_at": r.retryAt})
}

// end finishes an attempt and returns the session to ready; notice, when
// set, is a model-visible turn.ended notice (the next attempt sees why the
// last one ended).
func (r *runner) end(ctx context.Context, a *attempt, state, outcome string, notice map[string]any) error {
	return r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		if err := tx.FinishAttempt(a.id, state, outcome); err != nil {
			return err
		}
		if notice != nil {
			if _, err := tx.Notice(r.session, "turn.ended", notice, true); err != nil {
				return err
			}
		}
		s, err := tx.Session(r.session)
		if err != nil || s.State != store.StateRunning {
			return err
		}
		return tx.TransitionSession(r.session, store.StateRunning, store.StateReady, outcome)
	})
}
