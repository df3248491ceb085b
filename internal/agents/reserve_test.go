package agents

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

type reserved struct {
	release func()
	err     error
}

func reserveAsync(a *Agents, ctx context.Context, session string, usd float64) <-chan reserved {
	out := make(chan reserved, 1)
	go func() {
		rel, err := a.Reserve(ctx, session, usd)
		out <- reserved{rel, err}
	}()
	return out
}

// Requests under a budget.usd reserve their largest cost before they
// start: while the subtree's ledger and what is reserved under it reach
// the budget, the next one (a grandchild's too) waits for a release, and
// a budget spent by the ledger ends its child, naming budget.usd. A
// session under no budget.usd reserves nothing; a waiter's context ends
// its wait.
func TestReserveAgainstATreeBudget(t *testing.T) {
	a, st, _, _ := newTree(t)
	ctx := context.Background()
	free, err := call(t, a, "default", "agents.spawn", `{"task":"free"}`)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // no budget.usd: nothing reserved, nothing waits
		if _, err := a.Reserve(ctx, store.ChildSessionID(free.ID), 1); err != nil {
			t.Fatal(err)
		}
	}
	c, err := call(t, a, "default", "agents.spawn", `{"task":"t","budget":{"usd":0.1}}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	g, err := call(t, a, child, "agents.spawn", `{"task":"g"}`)
	if err != nil {
		t.Fatal(err)
	}
	gs := store.ChildSessionID(g.ID)
	rel1, err := a.Reserve(ctx, gs, 0.06)
	if err != nil {
		t.Fatal(err)
	}
	rel2, err := a.Reserve(ctx, child, 0.06) // 0.06 reserved is under 0.10: it starts
	if err != nil {
		t.Fatal(err)
	}
	third := reserveAsync(a, ctx, gs, 0.06) // 0.12 reserved: it waits
	select {
	case r := <-third:
		t.Fatalf("a request started with the budget reserved in full: %v", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	cctx, cancel := context.WithCancel(ctx)
	cancelled := reserveAsync(a, cctx, child, 0.01)
	time.Sleep(100 * time.Millisecond) // it waits
	cancel()
	if r := <-cancelled; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a waiter whose context ended: %v", r.err)
	}
	spendRow(t, st, gs, 0.03) // the first request's row, then its release
	rel1()
	rel1() // once only
	r := <-third
	if r.err != nil {
		t.Fatalf("0.03 spent and 0.06 reserved of 0.10: %v", r.err)
	}
	spendRow(t, st, child, 0.05)
	rel2()
	spendRow(t, st, gs, 0.04)
	r.release()
	// 0.12 of 0.10 by the ledger: the next request ends child-1.
	if _, err := a.Reserve(ctx, gs, 0.01); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "budget.usd of "+child) {
		t.Fatalf("a request under a spent budget.usd: %v", err)
	}
	if j := jobOf(t, st, c.ID); j.State != store.JobFailed || !strings.Contains(j.Error, "budget.usd") {
		t.Fatalf("child-1 %s: %s, want failed by its budget.usd", j.State, j.Error)
	}
	if n := len(a.res.by); n != 0 {
		t.Fatalf("%d budgets hold reservations after every release", n)
	}
}
