package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// benchTree writes files files of 1 KiB in ten directories under dir.
func benchTree(b *testing.B, dir string, files int) {
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("f%d.txt", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, make([]byte, 1024), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpawnWorkspace measures agents.spawn by workspace mode, side
// by side: shared (the baseline: the spawn's transaction only), read_only
// (plus the Landlock probe of what is enforced), worktree of a git
// repository of 200 files of 1 KiB (git worktree add) and worktree of a
// directory of the same 200 files that is no repository (a copy).
func BenchmarkSpawnWorkspace(b *testing.B) {
	if _, err := exec.LookPath("git"); err != nil {
		b.Skip("git is not installed")
	}
	repo, plain := b.TempDir(), b.TempDir()
	benchTree(b, repo, 200)
	benchTree(b, plain, 200)
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "tree"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	for _, c := range []struct{ name, mode, root string }{
		{"shared", "shared", repo}, {"read_only", "read_only", repo}, {"worktree-git", "worktree", repo}, {"worktree-copy", "worktree", plain},
	} {
		b.Run(c.name, func(b *testing.B) {
			st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			g, err := hostgit.New(filepath.Join(b.TempDir(), "hostgit"))
			if err != nil {
				b.Fatal(err)
			}
			ws := &workspace.Workspaces{Root: c.root, Dir: filepath.Join(b.TempDir(), "worktrees"), Git: g}
			a := New(Config{Store: st, Workspaces: ws, Limits: store.ChildLimits{MaxDepth: 2, MaxDescendants: 32, MaxConcurrent: 32}})
			req := worker.Request{Op: "agents.spawn", Args: json.RawMessage(`{"task":"edit the widgets in src/","workspace":"` + c.mode + `"}`)}
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
		})
	}
}
