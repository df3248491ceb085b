package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// BenchmarkSpawn measures agents.spawn as a cell's request: arguments
// checked (the budget too), the limits read (the tree's tokens too), and the job, the session and the task input
// committed in one transaction, then the job read back (no release here, so
// no activation; the child's turn loop is not started). Every 32 spawns use a fresh root, so the tree stays the size
// [agents] defaults allow.
func BenchmarkSpawn(b *testing.B) {
	st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	a := New(Config{Store: st, Limits: store.ChildLimits{MaxDepth: 2, MaxDescendants: 32, MaxConcurrent: 32, MaxTreeTokens: 10_000_000}})
	req := worker.Request{Op: "agents.spawn", Args: json.RawMessage(`{"task":"count the widgets in src/","refs":["e1","s2"],"budget":{"tokens":10000}}`)}
	var ctx context.Context
	b.ResetTimer()
	for i := range b.N {
		if i%32 == 0 {
			root := fmt.Sprintf("root-%d", i)
			if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession(root); return err }); err != nil {
				b.Fatal(err)
			}
			ctx = workbench.WithSession(context.Background(), root)
		}
		if _, err := a.HandleRequest(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJobInsert is the baseline: one job inserted and started in one
// transaction (what jobs.run commits before its process starts).
func BenchmarkJobInsert(b *testing.B) {
	st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		b.Fatal(err)
	}
	spec := json.RawMessage(`{"argv":["make","test"]}`)
	b.ResetTimer()
	for range b.N {
		if err := st.Write(context.Background(), func(tx *store.Tx) error {
			id, err := tx.InsertJob(store.NewJob{Kind: "command", Session: "default", Spec: spec, Recovery: "manual"})
			if err != nil {
				return err
			}
			_, err = tx.StartJob(id)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpawnProfile is BenchmarkSpawn with a profile: the same spawn,
// plus the profile read and parsed from the release's tree, its route
// checked, its budget narrowed and its instructions added to the task
// input (and the parent on a release, so the child is pinned too, as in
// BenchmarkSpawnPinned, its baseline).
func BenchmarkSpawnProfile(b *testing.B) {
	benchSpawnPinned(b, `{"task":"count the widgets in src/","refs":["e1","s2"],"budget":{"tokens":10000},"profile":"review"}`)
}

// BenchmarkSpawnPinned is BenchmarkSpawn with the parent on a release (the
// child is pinned to it): the baseline of BenchmarkSpawnProfile.
func BenchmarkSpawnPinned(b *testing.B) {
	benchSpawnPinned(b, `{"task":"count the widgets in src/","refs":["e1","s2"],"budget":{"tokens":10000}}`)
}

func benchSpawnPinned(b *testing.B, args string) {
	a, st := newProfiled(b, reviewFiles)
	a.cfg.Limits = store.ChildLimits{MaxDepth: 2, MaxDescendants: 32, MaxConcurrent: 32}
	a.cfg.Jobs = nil
	req := worker.Request{Op: "agents.spawn", Args: json.RawMessage(args)}
	var ctx context.Context
	b.ResetTimer()
	for i := range b.N {
		if i%32 == 0 {
			root := fmt.Sprintf("root-%d", i)
			if err := st.Write(context.Background(), func(tx *store.Tx) error {
				if _, err := tx.EnsureSession(root); err != nil {
					return err
				}
				_, err := tx.Activate(root, 0, testRelease, "initial", "bench")
				return err
			}); err != nil {
				b.Fatal(err)
			}
			ctx = workbench.WithSession(context.Background(), root)
		}
		if _, err := a.HandleRequest(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
