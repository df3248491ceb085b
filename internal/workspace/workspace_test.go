package workspace

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/store"
)

func requireGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
}

// run runs git in dir for the test, as a user would.
func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// repo is a git repository with one commit of notes.txt.
func repo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	run(t, dir, "init", "-q", "-b", "main")
	write(t, filepath.Join(dir, "notes.txt"), "root\n")
	run(t, dir, "add", "notes.txt")
	run(t, dir, "commit", "-q", "-m", "first")
	return dir
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Two worktrees of one repository are separate directories on separate
// branches from HEAD: an edit in one is in neither the other nor the root.
func TestWorktreesDoNotCollide(t *testing.T) {
	requireGit(t)
	root := repo(t)
	write(t, filepath.Join(root, "notes.txt"), "uncommitted\n")
	w := testWorkspaces(t, root)
	a, err := w.Make(t.Context(), w.Shared(), "default")
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.Make(t.Context(), w.Shared(), "default")
	if err != nil {
		t.Fatal(err)
	}
	if a.Dir == b.Dir || a.Branch == b.Branch || a.Mode != store.WorkspaceWorktree || a.Kind != "git" {
		t.Fatalf("places %+v and %+v", a, b)
	}
	head := run(t, root, "rev-parse", "HEAD")
	if a.Base != head || !strings.HasPrefix(a.Branch, "klbr/default-") || !strings.HasPrefix(a.Dir, w.Dir+"/") {
		t.Fatalf("place %+v, want a branch klbr/default-… from %s under %s", a, head, w.Dir)
	}
	if got := read(t, filepath.Join(a.Dir, "notes.txt")); got != "root\n" {
		t.Fatalf("the worktree starts with %q, want HEAD's", got)
	}
	write(t, filepath.Join(a.Dir, "notes.txt"), "from a\n")
	write(t, filepath.Join(b.Dir, "notes.txt"), "from b\n")
	if read(t, filepath.Join(a.Dir, "notes.txt")) != "from a\n" || read(t, filepath.Join(root, "notes.txt")) != "uncommitted\n" {
		t.Fatal("the edits collided")
	}
	// Work committed in a worktree is on its branch, in the child's own
	// repository, which shares no git directory with the root's.
	run(t, a.Dir, "commit", "-q", "-am", "a's work")
	if a.GitDir != "" || run(t, a.Dir, "rev-parse", "--path-format=absolute", "--git-common-dir") != filepath.Join(a.Dir, ".git") {
		t.Fatalf("the child's git dir is not its own: %+v", a)
	}
	// Collect brings the branch into the root's repository; removing the
	// worktree collects it too and keeps it.
	if err := w.Collect(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if got := run(t, root, "show", a.Branch+":notes.txt"); got != "from a" {
		t.Fatalf("the branch holds %q", got)
	}
	write(t, filepath.Join(a.Dir, "notes.txt"), "from a, again\n")
	run(t, a.Dir, "commit", "-q", "-am", "a's later work")
	if err := w.Remove(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the worktree is still there: %v", err)
	}
	if got := run(t, root, "show", a.Branch+":notes.txt"); got != "from a, again" {
		t.Fatalf("after Remove the branch holds %q", got)
	}
	if err := w.Remove(t.Context(), Place{Mode: store.WorkspaceWorktree, Dir: root}); err == nil {
		t.Fatal("Remove accepted a directory that is no worktree of klbr's")
	}
}

// A workspace in a subdirectory of a repository: the worktree is of the
// whole repository, and the child works in the same subdirectory of it.
func TestWorktreeOfASubdirectory(t *testing.T) {
	requireGit(t)
	top := repo(t)
	sub := filepath.Join(top, "src")
	os.Mkdir(sub, 0o755)
	write(t, filepath.Join(sub, "a.go"), "package a\n")
	run(t, top, "add", ".")
	run(t, top, "commit", "-q", "-m", "src")
	w := testWorkspaces(t, sub)
	p, err := w.Make(t.Context(), w.Shared(), "default")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p.Dir) != "src" || read(t, filepath.Join(p.Dir, "a.go")) != "package a\n" {
		t.Fatalf("place %+v", p)
	}
}

// No worktree is made, and nothing is left behind, from a repository
// without a commit or from a read-only place. One that configures a
// checkout filter gets a worktree without it: the child's repository is
// the host's, and its config names no filter.
func TestWorktreeRefusals(t *testing.T) {
	requireGit(t)
	wt := filepath.Join(t.TempDir(), "worktrees")
	empty := t.TempDir()
	run(t, empty, "init", "-q")
	g := hostGit(t)
	w := &Workspaces{Root: empty, Dir: wt, Git: g}
	if _, err := w.Make(t.Context(), w.Shared(), "default"); err == nil || !strings.Contains(err.Error(), "no commit") {
		t.Fatalf("an unborn HEAD: %v", err)
	}
	if _, err := w.Make(t.Context(), w.ReadOnly(w.Shared()), "default"); err == nil {
		t.Fatal("a worktree of a read-only place")
	}
	if ents, _ := os.ReadDir(wt); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
	filtered := repo(t)
	marker := filepath.Join(t.TempDir(), "pwned")
	run(t, filtered, "config", "filter.x.smudge", "touch "+marker)
	write(t, filepath.Join(filtered, ".gitattributes"), "* filter=x\n")
	run(t, filtered, "-c", "filter.x.clean=cat", "add", ".gitattributes")
	run(t, filtered, "-c", "filter.x.clean=cat", "commit", "-q", "-m", "filtered")
	w = &Workspaces{Root: filtered, Dir: wt, Git: g}
	p, err := w.Make(t.Context(), w.Shared(), "default")
	if err != nil {
		t.Fatalf("a smudge filter: %v", err)
	}
	if _, err := os.Stat(marker); err == nil || read(t, filepath.Join(p.Dir, "notes.txt")) != "root\n" {
		t.Fatalf("the workspace's smudge filter ran, or the file is not HEAD's: %v", err)
	}
}

// A directory that is no repository is copied (links as links, the data
// directory left out); over its limits the copy is refused and removed.
func TestCopyOfANonRepository(t *testing.T) {
	requireGit(t) // to tell a repository from none
	root := t.TempDir()
	write(t, filepath.Join(root, "notes.txt"), "root\n")
	os.Mkdir(filepath.Join(root, "sub"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "sub", "run.sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Symlink("notes.txt", filepath.Join(root, "link"))
	data := filepath.Join(root, "data")
	os.Mkdir(data, 0o700)
	write(t, filepath.Join(data, "secret"), "token")
	w := &Workspaces{Root: root, Dir: filepath.Join(data, "worktrees"), Exclude: []string{data}, Git: hostGit(t)}
	p, err := w.Make(t.Context(), w.Shared(), "default")
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != "copy" || p.Branch != "" || p.Root != root {
		t.Fatalf("place %+v", p)
	}
	if read(t, filepath.Join(p.Dir, "notes.txt")) != "root\n" {
		t.Fatal("notes.txt not copied")
	}
	if fi, err := os.Stat(filepath.Join(p.Dir, "sub", "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(p.Dir, "link")); err != nil || l != "notes.txt" {
		t.Fatalf("link: %q %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(p.Dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the data directory was copied: %v", err)
	}
	write(t, filepath.Join(p.Dir, "notes.txt"), "child\n")
	if read(t, filepath.Join(root, "notes.txt")) != "root\n" {
		t.Fatal("the copy's edit reached the root")
	}
	if err := w.Remove(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	for _, lim := range []Limits{{MaxFiles: 2}, {MaxBytes: 5}} {
		w.Limits = lim
		if _, err := w.Make(t.Context(), w.Shared(), "default"); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("limits %+v: %v, want ErrTooLarge", lim, err)
		}
	}
	if ents, _ := os.ReadDir(w.Dir); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

// The sandbox of a place: a worktree's directory and git directory
// replace the workspace's write grant; a read-only place has none, and is
// readable where it lies beneath a denied path.
func TestSandboxFor(t *testing.T) {
	base := kernel.Sandbox{Deny: []string{"/data"}, ReadWrite: []string{"/ws", "/data/drafts"}}
	w := &Workspaces{Root: "/ws", Sandbox: base}
	if sb := w.SandboxFor(w.Shared()); !slices.Equal(sb.ReadWrite, base.ReadWrite) {
		t.Fatalf("shared: %v", sb.ReadWrite)
	}
	wt := Place{Mode: store.WorkspaceWorktree, Kind: "git", Dir: "/data/worktrees/x", GitDir: "/ws/.git"}
	if sb := w.SandboxFor(wt); !slices.Equal(sb.ReadWrite, []string{"/data/drafts", "/data/worktrees/x", "/ws/.git"}) {
		t.Fatalf("worktree: %v", sb.ReadWrite)
	}
	ro := w.SandboxFor(Place{Mode: store.WorkspaceReadOnly, Dir: "/data/worktrees/x", ReadOnly: true})
	if !slices.Equal(ro.ReadWrite, []string{"/data/drafts"}) || !slices.Contains(ro.ReadOnly, "/data/worktrees/x") {
		t.Fatalf("read-only: %+v", ro)
	}
	if !slices.Equal(base.ReadWrite, []string{"/ws", "/data/drafts"}) || len(base.ReadOnly) != 0 {
		t.Fatalf("the base sandbox changed: %+v", base)
	}
	none := &Workspaces{Root: "/ws"}
	if sb := none.SandboxFor(Place{Dir: "/ws", ReadOnly: true}); sb.Active() {
		t.Fatalf("no sandbox became one: %+v", sb)
	}
	if e := none.Enforcement(Place{Dir: "/ws", ReadOnly: true}); !strings.HasPrefix(e, "NOT enforced") {
		t.Fatalf("enforcement without a sandbox: %q", e)
	}
}

// Enforcement says what holds, measured: Landlock where the kernel has
// it, unless the directory lies where workers may write anyway.
func TestEnforcement(t *testing.T) {
	w := &Workspaces{Root: "/srv/ws", Sandbox: kernel.Sandbox{Deny: []string{"/data"}, ReadWrite: []string{"/srv/ws"}}}
	got := w.Enforcement(w.ReadOnly(w.Shared()))
	if _, err := kernel.LandlockABI(); err != nil {
		if !strings.HasPrefix(got, "NOT enforced: landlock") {
			t.Fatalf("without Landlock: %q", got)
		}
		return
	}
	if !strings.HasPrefix(got, "Landlock (ABI ") || !strings.Contains(got, "EACCES") || !strings.Contains(got, "ReadOnlyPaths") {
		t.Fatalf("with Landlock: %q", got)
	}
	w.Root = "/tmp/ws"
	if got := w.Enforcement(w.ReadOnly(w.Shared())); !strings.HasPrefix(got, "NOT enforced: /tmp/ws lies in /tmp") {
		t.Fatalf("in /tmp: %q", got)
	}
}

// Without git on the PATH a repository is refused, not copied; a plain
// directory is still copied.
func TestWithoutGit(t *testing.T) {
	requireGit(t) // to make the repository
	root := repo(t)
	plain := t.TempDir()
	t.Setenv("PATH", t.TempDir())
	w := &Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees")}
	if _, err := w.Make(t.Context(), w.Shared(), "default"); err == nil || !strings.Contains(err.Error(), "git is not on klbr-core's PATH") {
		t.Fatalf("a repository without git: %v", err)
	}
	w.Root = plain
	if p, err := w.Make(t.Context(), w.Shared(), "default"); err != nil || p.Kind != "copy" {
		t.Fatalf("a plain directory without git: %+v, %v", p, err)
	}
}

// A shared child inherits its parent's place: a worktree as the parent
// has it, read-only when the parent's is (with what is enforced).
func TestInherit(t *testing.T) {
	w := &Workspaces{Root: "/srv/ws", Sandbox: kernel.Sandbox{Deny: []string{"/data"}, ReadWrite: []string{"/srv/ws"}}}
	wt := Place{Mode: store.WorkspaceWorktree, Kind: "git", Dir: "/data/worktrees/x", GitDir: "/srv/ws/.git", Branch: "klbr/x"}
	if p := w.Inherit(wt); p.Mode != store.WorkspaceShared || p.Dir != wt.Dir || p.GitDir != wt.GitDir || p.ReadOnly {
		t.Fatalf("a shared child of a worktree child: %+v", p)
	}
	p := w.Inherit(w.ReadOnly(wt))
	if p.Mode != store.WorkspaceShared || !p.ReadOnly || p.Enforced == "" || len(w.SandboxFor(p).ReadWrite) != 0 {
		t.Fatalf("a shared child of a read-only child: %+v", p)
	}
}

// testWorkspaces is a Workspaces of root with its worktrees in a
// temporary directory.
func testWorkspaces(t *testing.T, root string) *Workspaces {
	t.Helper()
	return &Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees"), Git: hostGit(t)}
}

func hostGit(t *testing.T) *hostgit.Git {
	t.Helper()
	g, err := hostgit.New(filepath.Join(t.TempDir(), "hostgit"))
	if err != nil {
		citest.SkipOrFail(t, err.Error())
	}
	return g
}
