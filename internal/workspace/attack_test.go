package workspace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// plantScript writes a script that leaves a line in marker when anything
// runs it.
func plantScript(t *testing.T) (script, marker string) {
	t.Helper()
	dir := t.TempDir()
	marker = filepath.Join(dir, "ran")
	script = filepath.Join(dir, "evil.sh")
	write(t, script, "#!/bin/sh\necho \"$0 $*\" >> "+marker+"\ncat >/dev/null 2>&1 || true\n")
	os.Chmod(script, 0o755)
	return script, marker
}

var everyHook = []string{"pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "post-merge",
	"reference-transaction", "post-index-change", "pre-auto-gc", "post-rewrite", "pre-push", "pre-receive", "update", "post-update"}

// plantGit makes gitDir run script every way a repository can: hooks, the
// file-system monitor, filters and drivers, an included config.
func plantGit(t *testing.T, gitDir, script string) {
	t.Helper()
	os.MkdirAll(filepath.Join(gitDir, "hooks"), 0o755)
	body := read(t, script)
	for _, h := range everyHook {
		write(t, filepath.Join(gitDir, "hooks", h), body)
		os.Chmod(filepath.Join(gitDir, "hooks", h), 0o755)
	}
	inc := filepath.Join(t.TempDir(), "evil.config")
	write(t, inc, "[core]\n\tfsmonitor = "+script+"\n\talternateRefsCommand = "+script+"\n[uploadpack]\n\tpackObjectsHook = "+script+"\n")
	f, err := os.OpenFile(filepath.Join(gitDir, "config"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("[core]\n\tfsmonitor = " + script + "\n\thooksPath = " + filepath.Join(gitDir, "hooks") + "\n" +
		"[filter \"evil\"]\n\tclean = " + script + "\n\tsmudge = " + script + "\n" +
		"[diff \"evil\"]\n\ttextconv = " + script + "\n[merge \"evil\"]\n\tdriver = " + script + "\n" +
		"[include]\n\tpath = " + inc + "\n")
	f.Close()
}

// ownerGit runs git in dir as the owner of the workspace would: the
// normal environment, the repository's own config and hooks. A failure is
// logged: what ran matters more, and the caller checks that first.
func ownerGit(t *testing.T, dir string, args ...string) error {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=owner", "GIT_AUTHOR_EMAIL=o@o", "GIT_COMMITTER_NAME=owner", "GIT_COMMITTER_EMAIL=o@o")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Logf("git %v: %v\n%s", args, err, strings.TrimSpace(string(out)))
	}
	return err
}

// A child owns its worktree and whatever git directory it can reach from
// there: what it plants in that git directory (hooks, config) must not run
// when the owner later runs git in the workspace, nor when the host brings
// the child's branch back.
func TestChildGitDoesNotRunForTheOwner(t *testing.T) {
	requireGit(t)
	root := repo(t)
	write(t, filepath.Join(root, ".gitattributes"), "*.txt filter=evil diff=evil merge=evil\n")
	run(t, root, "add", ".gitattributes")
	run(t, root, "commit", "-q", "-m", "attributes")
	w := testWorkspaces(t, root)
	p, err := w.Make(t.Context(), w.Shared(), "child")
	if err != nil {
		t.Fatal(err)
	}
	// The child's work, committed on its branch.
	write(t, filepath.Join(p.Dir, "notes.txt"), "the child's\n")
	run(t, p.Dir, "commit", "-q", "-am", "child's work")
	work := run(t, p.Dir, "rev-parse", "HEAD")
	// Then it plants, in the git directory its worktree leads to.
	script, marker := plantScript(t)
	gitDir := run(t, p.Dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	plantGit(t, gitDir, script)

	// The host brings the branch back and removes the worktree.
	if err := w.Remove(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the host ran the child's program:\n%s", b)
	}
	if got := run(t, root, "rev-parse", p.Branch); got != work {
		t.Fatalf("the parent has %s on %s, want the child's %s", got, p.Branch, work)
	}
	// The owner commits, checks out and merges in the workspace, as a user does.
	write(t, filepath.Join(root, "other.md"), "owner\n")
	errs := []error{ownerGit(t, root, "add", "other.md"), ownerGit(t, root, "commit", "-q", "-m", "owner's work"),
		ownerGit(t, root, "status"), ownerGit(t, root, "merge", "-q", "--no-edit", p.Branch)}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the owner's git ran the child's program:\n%s", b)
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := read(t, filepath.Join(root, "notes.txt")); got != "the child's\n" {
		t.Fatalf("after the merge notes.txt holds %q", got)
	}
}

// What the workspace's own repository holds (its owner's, or a root
// cell's) does not run in klbr-core when it makes a child's worktree and
// brings the branch back.
func TestWorkspaceGitDoesNotRunInTheHost(t *testing.T) {
	requireGit(t)
	root := repo(t)
	write(t, filepath.Join(root, ".gitattributes"), "*.txt filter=evil diff=evil merge=evil\n")
	run(t, root, "add", ".gitattributes")
	run(t, root, "commit", "-q", "-m", "attributes")
	script, marker := plantScript(t)
	plantGit(t, filepath.Join(root, ".git"), script)
	os.MkdirAll(filepath.Join(root, ".git", "objects", "info"), 0o755)
	write(t, filepath.Join(root, ".git", "objects", "info", "alternates"), filepath.Join(root, ".git", "objects")+"\n")
	w := testWorkspaces(t, root)
	p, err := w.Make(t.Context(), w.Shared(), "child")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(p.Dir, "notes.txt"), "the child's\n")
	run(t, p.Dir, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-am", "child's work")
	if err := w.Remove(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the host ran the workspace repository's program:\n%s", b)
	}
}
