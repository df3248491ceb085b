package hostgit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
)

func newGit(t *testing.T) *Git {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	g, err := New(filepath.Join(t.TempDir(), "hostgit"))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Nothing klbr-core inherited reaches git: a GIT_CONFIG_PARAMETERS naming
// a program, a GIT_DIR elsewhere, GIT_EXTERNAL_DIFF.
func TestInheritedGitVariablesAreDropped(t *testing.T) {
	g := newGit(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "evil.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755)
	other := filepath.Join(dir, "other.git")
	if out, err := exec.Command("git", "init", "-q", "--bare", other).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Setenv("GIT_DIR", other)
	t.Setenv("GIT_CONFIG_PARAMETERS", "'core.pager'='"+script+"' 'diff.external'='"+script+"'")
	t.Setenv("GIT_EXTERNAL_DIFF", script)
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
	t.Setenv("GIT_CONFIG_VALUE_0", dir)
	ctx := context.Background()
	repo, done, err := g.Scratch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	c, err := g.Commit(ctx, repo, map[string][]File{"a": {{Path: "x", Data: []byte("1\n")}}, "b": {{Path: "x", Data: []byte("2\n")}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Run(ctx, Cmd{GitDir: repo}, "diff", c["a"], c["b"])
	if err != nil || !strings.Contains(string(out), "+2") {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("an inherited variable made git run a program")
	}
	if out, _ := exec.Command("git", "--git-dir="+other, "rev-parse", "--verify", "-q", "HEAD").Output(); len(out) != 0 {
		t.Fatal("git wrote to the inherited GIT_DIR")
	}
}

// Commit takes any path bytes a tree may hold: quotes, backslashes,
// newlines, spaces, UTF-8.
func TestCommitQuotesPaths(t *testing.T) {
	g := newGit(t)
	ctx := context.Background()
	repo, done, err := g.Scratch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	paths := []string{"plain.md", "with space.md", "quo\"te", "back\\slash", "new\nline", "tab\there", "dir/ünï.md", "\x01ctl"}
	var files []File
	for _, p := range paths {
		files = append(files, File{Path: p, Data: []byte(p)})
	}
	c, err := g.Commit(ctx, repo, map[string][]File{"t": files})
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Run(ctx, Cmd{GitDir: repo}, "ls-tree", "-r", "-z", "--name-only", c["t"])
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	want := map[string]bool{}
	for _, p := range paths {
		want[p] = true
	}
	for _, p := range got {
		if !want[p] {
			t.Errorf("unexpected path %q", p)
		}
		delete(want, p)
	}
	if len(want) > 0 {
		t.Errorf("missing paths %v (got %q)", want, got)
	}
}

// Commit keeps an executable file's mode and a symbolic link as a link
// (its target a blob, which nothing follows): the diff between two trees
// says so in git's own terms.
func TestCommitModesAndLinks(t *testing.T) {
	g := newGit(t)
	ctx := context.Background()
	repo, done, err := g.Scratch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	c, err := g.Commit(ctx, repo, map[string][]File{
		"base": {{Path: "run.sh", Data: []byte("echo\n")}, {Path: "data", Data: []byte("x\n")}},
		"work": {{Path: "run.sh", Data: []byte("echo\n"), Exec: true}, {Path: "data", Data: []byte("../../etc/passwd"), Link: true},
			{Path: "new", Data: []byte("/root/.ssh/id_ed25519"), Link: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Run(ctx, Cmd{GitDir: repo}, "ls-tree", "-r", c["work"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"100755 blob", "120000 blob"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("ls-tree of the work tree has no %q:\n%s", want, out)
		}
	}
	diff, err := g.Run(ctx, Cmd{GitDir: repo}, "diff", "--binary", c["base"], c["work"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"old mode 100644\nnew mode 100755", "new file mode 120000", "+../../etc/passwd\n\\ No newline at end of file"} {
		if !strings.Contains(string(diff), want) {
			t.Fatalf("the diff has no %q:\n%s", want, diff)
		}
	}
}
