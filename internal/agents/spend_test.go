package agents

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/budget"
	"github.com/klbr-dev/klbr/internal/store"
)

// spendRow commits one ledger row of usd for session (a summary: no step,
// no tokens), as a priced request would.
func spendRow(t *testing.T, st *store.Store, session string, usd float64) {
	t.Helper()
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		return tx.RecordSpend(store.SpendEntry{Session: session, Route: "paid", Purpose: "summary", CostUSD: &usd, CostSource: store.CostPrice}, 0)
	}); err != nil {
		t.Fatal(err)
	}
}

// budget.usd bounds a child's subtree by the spend ledger: a grandchild's
// spawn is clamped to what its spawner has left in dollars, a spent
// spawner refuses to spawn, and before the next model request of any
// session under it, a subtree past its dollars ends the child (its
// children cancelled), naming budget.usd.
func TestChildUSDBudgetByTheLedger(t *testing.T) {
	a, st, _, _ := newTree(t)
	ctx := context.Background()
	c, err := call(t, a, "default", "agents.spawn", `{"task":"t","budget":{"usd":0.1}}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	spendRow(t, st, "default", 5) // the root's spend is not the child's
	spendRow(t, st, child, 0.03)
	g, err := call(t, a, child, "agents.spawn", `{"task":"g","budget":{"usd":1}}`)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := budget.Parse(g.Budget); err != nil || b.USD == nil || *b.USD < 0.0699 || *b.USD > 0.07 {
		t.Fatalf("grandchild's budget %s, want usd 0.07 (what child-1 has left)", g.Budget)
	}
	gs := store.ChildSessionID(g.ID)
	if err := a.Check(ctx, gs); err != nil {
		t.Fatalf("0.03 of 0.10 spent: %v", err)
	}
	spendRow(t, st, gs, 0.05) // within its own 0.07
	spendRow(t, st, child, 0.03)
	if _, err := call(t, a, child, "agents.spawn", `{"task":"more"}`); code(err) != "refused" ||
		!strings.Contains(err.Error(), "budget.usd of "+child) || !strings.Contains(err.Error(), "0.11 USD of 0.1 USD") {
		t.Fatalf("spawn by a child whose subtree spent its dollars: %v", err)
	}
	err = a.Check(ctx, gs)
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "spend 0.11 USD of 0.1 USD (budget.usd of "+child+")") {
		t.Fatalf("the grandchild's next request: %v", err)
	}
	if j := jobOf(t, st, c.ID); j.State != store.JobFailed || !strings.Contains(j.Error, "budget.usd") {
		t.Fatalf("child-1 %s: %s, want failed by its budget.usd", j.State, j.Error)
	}
	if j := jobOf(t, st, g.ID); j.State != store.JobCancelled {
		t.Fatalf("grandchild is %s, want cancelled with child-1", j.State)
	}
}
