package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
)

// A child on a host changes an executable bit and makes symbolic links in
// its copy: the patch that comes back carries them in git's terms (a mode
// change, links as links, their targets as text: nothing followed them,
// not the host's tar, not klbr-core, not git), and git apply in the
// parent's workspace makes them, the parent's choice.
func TestPatchCarriesLinksAndTheExecutableBit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	h := hosttest.Start(t)
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	e, err := hosts.New(hosts.Config{Hosts: map[string]hosts.Host{"lab": {Name: "lab", Target: tg, IdentityFile: h.IdentityFile,
		KnownHostsFile: h.KnownHostsFile, MaxJobs: 2, Wall: time.Hour, WorkDir: h.WorkDir, UserManager: h.Manager == config.ManagerUser}}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	arts, err := artifacts.New(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	for name, mode := range map[string]os.FileMode{"run.sh": 0o644, "tool": 0o755, "keep.txt": 0o644} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(name+"\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	w := &Workspaces{Root: ws, Dir: filepath.Join(t.TempDir(), "worktrees"), Git: hostGit(t), Hosts: e, Artifacts: arts}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := w.MakeOnHost(ctx, w.Shared(), "lab", "t")
	if err != nil {
		t.Fatal(err)
	}
	// The child's work, in its copy on the host.
	script := "set -e; cd " + p.Dir + "; chmod +x run.sh; chmod -x tool; ln -s keep.txt link; ln -s /etc/shadow abs; echo new > new.txt"
	if out, err := h.Enter("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("the child's work: %v %s", err, out)
	}
	patch, err := w.Patch(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	file, err := arts.Path(strings.TrimPrefix(patch.Ref, "a"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755",
		"diff --git a/tool b/tool\nold mode 100755\nnew mode 100644", "new file mode 120000", "+/etc/shadow\n\\ No newline at end of file"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("the patch has no %q:\n%s", want, body)
		}
	}
	if patch.Files != 5 {
		t.Fatalf("the patch counts %d files; want 5:\n%s", patch.Files, body)
	}
	if out, err := exec.Command("git", "-C", ws, "apply", file).CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v %s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(ws, "run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Fatalf("run.sh after the patch: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(ws, "tool")); err != nil || fi.Mode().Perm()&0o100 != 0 {
		t.Fatalf("tool after the patch: %v %v", fi.Mode(), err)
	}
	for link, target := range map[string]string{"link": "keep.txt", "abs": "/etc/shadow"} {
		if got, err := os.Readlink(filepath.Join(ws, link)); err != nil || got != target {
			t.Fatalf("%s after the patch: %q %v; want a link to %s", link, got, err, target)
		}
	}
}
