package behavior

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/hostgit"
)

func needGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
}

func writeFilesAt(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, body := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func publishFiles(t *testing.T, r *Releases, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	writeFilesAt(t, dir, files)
	m, err := r.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}

func copyDraft(t *testing.T, r *Releases, id string) (string, *os.Root) {
	t.Helper()
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.CopyFS(tree, os.DirFS(r.Tree(id))); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(tree, func(p string, d os.DirEntry, err error) error {
		return os.Chmod(p, map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()])
	})
	root, err := os.OpenRoot(tree)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return tree, root
}

func hostGit(t testing.TB) *hostgit.Git {
	t.Helper()
	g, err := hostgit.New(filepath.Join(t.TempDir(), "hostgit"))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const three = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n"

// A draft is diffed against its release; a stale draft
// rebased cleanly (three-way); one with a conflict reported, nothing changed.
func TestDraftDiffAndRebase(t *testing.T) {
	needGit(t)
	ctx := context.Background()
	r, _ := Open(t.TempDir())
	base := publishFiles(t, r, map[string]string{"soul.md": "# soul\n", "instructions.md": three, "notes.md": "keep\n"})
	tree, root := copyDraft(t, r, base)
	g := hostGit(t)
	writeFilesAt(t, tree, map[string]string{"instructions.md": strings.Replace(three, "two", "TWO (draft)", 1), "klbr_skills/new.py": "x = 1\n"})
	diff, trunc, err := DraftDiff(ctx, g, root, r.Tree(base))
	if err != nil || trunc || !strings.Contains(diff, "+TWO (draft)") || !strings.Contains(diff, "-two") || !strings.Contains(diff, "b/klbr_skills/new.py") {
		t.Fatalf("draft diff (%v, truncated %v):\n%s", err, trunc, diff)
	}
	if m, _, err := Scan(os.DirFS(tree)); err != nil || strings.Contains(strings.Join(filePaths(m), ","), ".git") {
		t.Fatalf("publication sees the draft's .git: %v %v", filePaths(m), err)
	}

	// The active release moved on: another line, and notes.md changed.
	newer := publishFiles(t, r, map[string]string{"soul.md": "# soul\n", "instructions.md": strings.Replace(three, "six", "SIX (release)", 1), "notes.md": "kept, edited\n"})
	rd, _, err := r.Diff(ctx, base, newer)
	if err != nil || !strings.Contains(rd, "+SIX (release)") || !strings.Contains(rd, "a/notes.md") || strings.Contains(rd, "/tree/") {
		t.Fatalf("release diff (%v):\n%s", err, rd)
	}
	res, err := Rebase(ctx, g, root, r.Tree(base), r.Tree(newer))
	if err != nil || len(res.Conflicts) != 0 {
		t.Fatalf("rebase: %+v %v", res, err)
	}
	b, _ := os.ReadFile(filepath.Join(tree, "instructions.md"))
	if !strings.Contains(string(b), "TWO (draft)") || !strings.Contains(string(b), "SIX (release)") {
		t.Fatalf("merged file:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(tree, "notes.md")); string(b) != "kept, edited\n" {
		t.Fatalf("the release's change was not taken: %q", b)
	}
	diff, _, _ = DraftDiff(ctx, g, root, r.Tree(newer))
	if strings.Contains(diff, "SIX") || !strings.Contains(diff, "TWO (draft)") {
		t.Fatalf("after the rebase the draft's diff is against the new release:\n%s", diff)
	}

	// A conflict: both change the same line. Reported; nothing changed.
	newest := publishFiles(t, r, map[string]string{"soul.md": "# soul\n", "instructions.md": strings.Replace(strings.Replace(three, "six", "SIX (release)", 1), "two", "2 (release)", 1), "notes.md": "kept, edited\n"})
	before, _ := os.ReadFile(filepath.Join(tree, "instructions.md"))
	res, err = Rebase(ctx, g, root, r.Tree(newer), r.Tree(newest))
	if err != nil || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "instructions.md" || !strings.Contains(res.Conflicts[0].Merged, "<<<<<<< draft") {
		t.Fatalf("conflict: %+v %v", res, err)
	}
	if after, _ := os.ReadFile(filepath.Join(tree, "instructions.md")); string(after) != string(before) {
		t.Fatal("a conflicting rebase changed the draft")
	}
}

func filePaths(m Manifest) []string {
	var out []string
	for _, f := range m.Files {
		out = append(out, f.Path)
	}
	return out
}
