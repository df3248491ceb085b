package agents

import (
	"context"
	"fmt"
	"sync"

	"github.com/klbr-dev/klbr/internal/budget"
)

// reservations are the largest costs of the model requests in flight under
// each child with a budget.usd: a request reserves its cost against the
// budget of every child above it (and its own) before it starts, and
// releases it once its step, and so its ledger row, is committed.
type reservations struct {
	mu      sync.Mutex
	by      map[string]float64 // a child's session -> USD reserved under it
	gen     uint64             // counts releases
	changed chan struct{}      // closed (and replaced) at each release
}

// usdBudget is one budget.usd above a request, with what its subtree's
// ledger holds.
type usdBudget struct {
	session      string
	limit, spent float64
}

// Reserve reserves usd, the largest cost of session's next model request,
// against the budget.usd of session and of every child above it, so that
// requests started at once overshoot a budget by no more than those in
// flight: while a budget's ledger plus what is reserved under it reach
// the limit, it waits for a request in flight to be released, then checks
// the budgets again (Check: a spent one ends its child, and the request
// is refused). release is called once the request's step is committed;
// a session under no budget.usd reserves nothing.
func (a *Agents) Reserve(ctx context.Context, session string, usd float64) (release func(), err error) {
	r := &a.res
	for {
		r.mu.Lock()
		gen, changed := r.gen, r.changed
		r.mu.Unlock()
		owners, err := a.usdBudgets(ctx, session)
		if err != nil {
			return nil, err
		}
		if len(owners) == 0 {
			return func() {}, nil
		}
		r.mu.Lock()
		if r.gen != gen { // a release committed a row the ledger read may have missed
			r.mu.Unlock()
			continue
		}
		full, spent := false, false
		for _, o := range owners {
			full = full || o.spent+r.by[o.session] >= o.limit
			spent = spent || o.spent >= o.limit
		}
		if !full {
			for _, o := range owners {
				r.by[o.session] += usd
			}
			r.mu.Unlock()
			return a.releaser(owners, usd), nil
		}
		r.mu.Unlock()
		if spent {
			if err := a.Check(ctx, session); err != nil {
				return nil, err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("budget.usd: waiting for the requests in flight: %w", context.Cause(ctx))
		case <-changed:
		}
	}
}

// releaser returns the release of usd reserved under owners (once).
func (a *Agents) releaser(owners []usdBudget, usd float64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			r := &a.res
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, o := range owners {
				if r.by[o.session] -= usd; r.by[o.session] <= 1e-12 {
					delete(r.by, o.session)
				}
			}
			r.gen++
			close(r.changed)
			r.changed = make(chan struct{})
		})
	}
}

// usdBudgets are the budget.usd of session and of every child above it,
// with what each one's subtree spent by the ledger.
func (a *Agents) usdBudgets(ctx context.Context, session string) ([]usdBudget, error) {
	links, err := chain(ctx, a.cfg.Store, session)
	if err != nil {
		return nil, err
	}
	var out []usdBudget
	for _, l := range links {
		b, err := budget.Parse(l.job.Budget)
		if err != nil || b.USD == nil {
			continue
		}
		spent, err := a.cfg.Store.SubtreeSpendUSD(ctx, l.session)
		if err != nil {
			return nil, err
		}
		out = append(out, usdBudget{session: l.session, limit: *b.USD, spent: spent})
	}
	return out, nil
}
