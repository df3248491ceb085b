package jobs

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/kernel"
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

// A local job with inputs= and outputs= runs in a directory of its own,
// as on a host: its inputs copied from the workspace (a link is not
// followed), its sandbox writing that directory although the data
// directory it lies in stays hidden, the files its globs match brought back
// as artifacts (no link), and the directory gone afterwards.
func TestLocalJobInputsAndOutputs(t *testing.T) {
	r := newRig(t)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("not for the job\n"), 0o600)
	os.MkdirAll(filepath.Join(r.workspace, "data"), 0o755)
	os.WriteFile(filepath.Join(r.workspace, "data", "in.txt"), []byte("hello\n"), 0o644)
	os.Symlink(secret, filepath.Join(r.workspace, "data", "link.txt"))
	m := New(Config{Store: r.st, Artifacts: r.arts, Kernel: r.env.Kernel, Python: r.env.Python, RuntimeSrc: r.env.Runtime,
		Workspace: r.workspace, Placer: r.env.Placer, Tree: func(string) string { return r.tree },
		Sandbox: kernel.Sandbox{Deny: []string{r.dir}, ReadWrite: []string{r.workspace}}})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	ctx := context.Background()
	script := "mkdir out && cp data/in.txt out/copy.txt && ls data > out/ls.txt && pwd > out/pwd.txt && ln -s " + secret +
		" out/l.txt && (cat " + filepath.Join(r.dir, "runtime.sqlite") + " >/dev/null 2>&1 && echo LEAK || true)"
	j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"sh", "-c", script},
		Inputs: []string{"data"}, Outputs: []string{"out/*.txt"}}})
	if err != nil {
		t.Fatal(err)
	}
	j, err = m.Wait(ctx, j.ID, 0, 60*time.Second)
	if err != nil || j.State != store.JobSucceeded || strings.Contains(j.OutputPreview, "LEAK") {
		t.Fatalf("job %s %q output %q (%v)", j.State, j.Error, j.OutputPreview, err)
	}
	var res struct {
		Artifacts     []store.JobFile `json:"artifacts"`
		InputsSkipped []string        `json:"inputs_skipped"`
	}
	if err := json.Unmarshal(j.Result, &res); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range res.Artifacts {
		p, _ := r.arts.Path(strings.TrimPrefix(f.Artifact, "a"))
		b, _ := os.ReadFile(p)
		got[f.Path] = string(b)
	}
	own := filepath.Join(r.dir, "jobs", strconv.FormatInt(j.ID, 10)+"-1")
	if len(got) != 3 || got["out/copy.txt"] != "hello\n" || got["out/ls.txt"] != "in.txt\n" || got["out/pwd.txt"] != own+"\n" {
		t.Fatalf("artifacts %q (result %s); want copy.txt, ls.txt and pwd.txt (%s)", got, j.Result, own)
	}
	if len(res.InputsSkipped) != 1 || !strings.HasPrefix(res.InputsSkipped[0], "data/link.txt") {
		t.Fatalf("inputs skipped %q, want the link", res.InputsSkipped)
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Fatalf("the job's directory stayed: %v", err)
	}
}
