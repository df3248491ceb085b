package agents

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// A worktree made for a spawn the store then refuses (a budget) is
// removed: nothing of the spawn is left. Ended, its worktree is removed on
// the parent's request; a running child's is not.
func TestWorktreeOfARefusedSpawnIsRemoved(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, _, _ := newAgents(t, store.ChildLimits{MaxConcurrent: 1})
	ws := &workspace.Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees")}
	a.cfg.Workspaces = ws
	one, err := call(t, a, "default", "agents.spawn", `{"task":"edit","workspace":"worktree"}`)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := store.ChildSpecOf(one)
	if spec.Workspace == nil || spec.Workspace.Kind != "copy" || filepath.Dir(spec.Workspace.Dir) != ws.Dir {
		t.Fatalf("spec %s", one.Spec)
	}
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"edit too","workspace":"worktree"}`); code(err) != "refused" {
		t.Fatalf("a second child past max_concurrent: %v", err)
	}
	if ents, _ := os.ReadDir(ws.Dir); len(ents) != 1 {
		t.Fatalf("worktrees %v, want the first child's only", ents)
	}
	remove := func() error {
		_, err := a.HandleRequest(workbench.WithSession(context.Background(), "default"),
			worker.Request{Op: "agents.remove_workspace", Args: json.RawMessage(`{"id":1}`)})
		return err
	}
	if err := remove(); code(err) != "state" {
		t.Fatalf("removing a running child's worktree: %v", err)
	}
	if _, err := call(t, a, "child-1", "agents.finish", `{"result":1}`); err != nil {
		t.Fatal(err)
	}
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spec.Workspace.Dir); !os.IsNotExist(err) {
		t.Fatalf("the ended child's copy is still there: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "notes.txt")); string(got) != "root\n" {
		t.Fatalf("the root changed: %q", got)
	}
}
