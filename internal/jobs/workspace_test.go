package jobs

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// A session with a workspace of its own (a child's worktree) runs its
// jobs.run commands there, and the job records it; the root workspace is
// not touched.
func TestJobsRunInTheSessionsWorkspace(t *testing.T) {
	r := newRig(t)
	own := t.TempDir()
	m := New(Config{Store: r.st, Artifacts: r.arts, Kernel: r.env.Kernel, Python: r.env.Python, RuntimeSrc: r.env.Runtime,
		Workspace: r.workspace, Placer: r.env.Placer, Tree: func(string) string { return r.tree },
		Workspaces: &workspace.Workspaces{Root: r.workspace, Lookup: func(_ context.Context, session string) (*workspace.Place, error) {
			return &workspace.Place{Mode: store.WorkspaceWorktree, Kind: "copy", Dir: own}, nil
		}}})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	out, err := NewOps(m).HandleRequest(workbench.WithSession(context.Background(), "default"),
		worker.Request{Op: "jobs.run", Args: json.RawMessage(`{"argv":["sh","-c","pwd; echo x > made.txt"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	var j store.Job
	if err := json.Unmarshal(out, &j); err != nil {
		t.Fatal(err)
	}
	j = wait(t, m, j.ID)
	if j.State != store.JobSucceeded || j.Workspace != own || !strings.Contains(j.OutputPreview, own) {
		t.Fatalf("job %s in %q, output %q; want it in %s", j.State, j.Workspace, j.OutputPreview, own)
	}
	if _, err := os.Stat(filepath.Join(own, "made.txt")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.workspace, "made.txt")); err == nil {
		t.Fatal("the command wrote the root workspace")
	}
}
