package agents

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
)

// chainOf spawns a chain of depth children under "default", each
// delegated local.send and given a token budget, each with 10 recorded
// steps, and returns the deepest child's session.
func chainOf(b *testing.B, depth int) (*Agents, *store.Store, string) {
	b.Helper()
	st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		b.Fatal(err)
	}
	m := jobs.New(jobs.Config{Store: st})
	b.Cleanup(m.Close)
	a := New(Config{Store: st, Jobs: m})
	session := "default"
	for range depth {
		j, err := call(b, a, session, "agents.spawn", `{"task":"t","delegate":["local.send"],"budget":{"tokens":1000000}}`)
		if err != nil {
			b.Fatal(err)
		}
		session = store.ChildSessionID(j.ID)
		recordSteps(b, st, session, 10, 10)
	}
	return a, st, session
}

// oneLevel is the baseline: the check a send made before delegation
// narrowed, of the sender's own grant only (its session and its job).
func oneLevel(ctx context.Context, st *store.Store, session, op string) error {
	s, err := st.Session(ctx, session)
	if err != nil || s.ParentID == "" {
		return err
	}
	j, err := st.ChildJobOf(ctx, session)
	if err != nil {
		return err
	}
	spec, _ := store.ChildSpecOf(j)
	if !slices.Contains(spec.Delegate, op) {
		return errors.New("refused")
	}
	return nil
}

// BenchmarkDelegated is a send's check of its grant, which reads the whole
// chain of spawners, at depths 1 and 4, against the baseline of the
// sender's own grant only (oneLevel, at the same depths).
func BenchmarkDelegated(b *testing.B) {
	for _, depth := range []int{1, 4} {
		_, st, s := chainOf(b, depth)
		ctx := context.Background()
		b.Run(fmt.Sprintf("baseline-own-grant/depth=%d", depth), func(b *testing.B) {
			for range b.N {
				if err := oneLevel(ctx, st, s, "local.send"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("chain/depth=%d", depth), func(b *testing.B) {
			for range b.N {
				if _, err := Delegated(ctx, st, s, "local.send", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheck is the check before a child's model request: every budget
// from the child up to its root, each against its subtree's usage; depth 1
// is a child of the root (what the check cost before a child's budget
// covered its subtree, plus the descendants' sum).
func BenchmarkCheck(b *testing.B) {
	for _, depth := range []int{1, 4} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			a, _, s := chainOf(b, depth)
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if err := a.Check(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReserve is what budget.usd's reservation adds to a child's
// model request: Check alone (the baseline) beside Check, Reserve and the
// release, in a chain whose every child has a budget.usd, at depths 1
// and 4.
func BenchmarkReserve(b *testing.B) {
	for _, depth := range []int{1, 4} {
		st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
			b.Fatal(err)
		}
		m := jobs.New(jobs.Config{Store: st})
		b.Cleanup(m.Close)
		a := New(Config{Store: st, Jobs: m})
		s := "default"
		for range depth {
			j, err := call(b, a, s, "agents.spawn", `{"task":"t","budget":{"tokens":1000000,"usd":100}}`)
			if err != nil {
				b.Fatal(err)
			}
			s = store.ChildSessionID(j.ID)
			recordSteps(b, st, s, 10, 10)
		}
		ctx := context.Background()
		b.Run(fmt.Sprintf("baseline-check/depth=%d", depth), func(b *testing.B) {
			for range b.N {
				if err := a.Check(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("check+reserve/depth=%d", depth), func(b *testing.B) {
			for range b.N {
				if err := a.Check(ctx, s); err != nil {
					b.Fatal(err)
				}
				release, err := a.Reserve(ctx, s, 0.01)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}
