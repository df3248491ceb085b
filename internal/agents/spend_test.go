package agents

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

// agents.max_spawns_per_day counts the child jobs in the store created
// since the day's start (all trees): past it a spawn is refused naming the
// cap and when it resets, and the next day spawns again.
// agents.max_spawns_per_tree counts the children under one child of the
// root, finished ones included: past it that tree spawns no more, while
// the root may still start a new tree.
func TestSpawnCaps(t *testing.T) {
	a, st, _, _ := newTree(t)
	start := time.Now().Add(-time.Hour)
	end := start.Add(24 * time.Hour)
	a.cfg.Limits.MaxSpawnsPerDay = 3
	a.cfg.Limits.Day = func() (time.Time, time.Time) { return start, end }
	c1, err := call(t, a, "default", "agents.spawn", `{"task":"one"}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c1.ID)
	for _, s := range []string{child, "default"} {
		if _, err := call(t, a, s, "agents.spawn", `{"task":"more"}`); err != nil {
			t.Fatal(err)
		}
	}
	_, err = call(t, a, "default", "agents.spawn", `{"task":"fourth"}`)
	if code(err) != "refused" || !strings.Contains(err.Error(), "3 children were spawned today") ||
		!strings.Contains(err.Error(), "agents.max_spawns_per_day = 3") || !strings.Contains(err.Error(), "resets "+end.Format("2006-01-02 15:04 MST")) {
		t.Fatalf("the fourth spawn of the day: %v", err)
	}
	if n, _ := st.Descendants(context.Background(), "default"); n != 3 {
		t.Fatalf("%d descendants after a refused spawn, want 3", n)
	}
	start, end = time.Now().Add(time.Second), time.Now().Add(25*time.Hour) // the next day
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"tomorrow"}`); err != nil {
		t.Fatalf("a spawn on the next day: %v", err)
	}

	a.cfg.Limits.MaxSpawnsPerDay = 0
	a.cfg.Limits.MaxSpawnsPerTree = 2
	g2, err := call(t, a, child, "agents.spawn", `{"task":"second in the tree"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{child, store.ChildSessionID(g2.ID)} {
		_, err := call(t, a, s, "agents.spawn", `{"task":"third in the tree"}`)
		if code(err) != "refused" || !strings.Contains(err.Error(), "the tree of "+child+" has spawned 2 children (agents.max_spawns_per_tree = 2)") ||
			!strings.Contains(err.Error(), "does not reset") {
			t.Fatalf("a third spawn in %s's tree by %s: %v", child, s, err)
		}
	}
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"a new tree"}`); err != nil {
		t.Fatalf("the root's spawn starts a new tree: %v", err)
	}
}
