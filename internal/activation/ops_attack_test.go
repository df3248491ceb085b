package activation

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/uidtest"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// attack is a script that leaves a marker when anything runs it.
func attack(t *testing.T) (script, marker string) {
	t.Helper()
	dir := t.TempDir()
	marker = filepath.Join(dir, "ran")
	script = filepath.Join(dir, "evil.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$0 $*\" >> "+marker+"\ncat\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, marker
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	mode := os.FileMode(0o644)
	if filepath.Base(filepath.Dir(p)) == "hooks" {
		mode = 0o755
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, mode)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(s)
	f.Close()
}

// A cell owns its draft's tree, a .git there included: whatever it writes
// into that .git (config, an included config, hooks) or into the tree
// (.gitattributes) must not run when the host diffs or rebases the draft.
// Run as root, the draft handed to an unprivileged uid as the daemon does.
func TestDraftGitRunsNothingOfTheCell(t *testing.T) {
	for _, owner := range []string{"daemon", "unprivileged"} {
		draftGitRunsNothing(t, owner)
	}
}

// TestDraftGitRunsNothingOfTheCellUnprivilegedChild is klbr-core as an
// unprivileged uid: the drafts are its own (its workers share its uid).
func TestDraftGitRunsNothingOfTheCellUnprivilegedChild(t *testing.T) {
	uidtest.Child(t, "TestDraftGitRunsNothingOfTheCellUnprivileged")
	draftGitRunsNothing(t, "daemon")
}

// TestDraftGitRunsNothingOfTheCell with klbr-core as an unprivileged uid
// (uidtest.Host, no capability, its own data and drafts): nothing planted
// in a draft runs on diff, rebase or publish.
func TestDraftGitRunsNothingOfTheCellUnprivileged(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	uidtest.Run(t, "TestDraftGitRunsNothingOfTheCellUnprivilegedChild", uidtest.Host, uidtest.Host, workertest.Share(t)...)
}

// draftGitRunsNothing plants each attack in a draft whose tree belongs to
// owner ("daemon": this process's uid; "unprivileged": nobody, handed
// over as a root daemon does) and diffs, rebases and publishes it.
func draftGitRunsNothing(t *testing.T, owner string) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	hooks := []string{"reference-transaction", "post-index-change", "post-checkout", "pre-rebase", "post-rewrite", "pre-commit", "post-commit", "pre-auto-gc"}
	cases := []struct {
		name  string
		plant func(t *testing.T, tree, script string)
	}{
		{"fsmonitor in .git/config", func(t *testing.T, tree, script string) {
			appendFile(t, filepath.Join(tree, ".git", "config"), "[core]\n\tfsmonitor = "+script+"\n")
		}},
		{"clean filter by .gitattributes", func(t *testing.T, tree, script string) {
			appendFile(t, filepath.Join(tree, ".gitattributes"), "* filter=evil diff=evil\n")
			appendFile(t, filepath.Join(tree, ".git", "config"), "[filter \"evil\"]\n\tclean = "+script+"\n\tprocess = "+script+"\n[diff \"evil\"]\n\ttextconv = "+script+"\n\tcommand = "+script+"\n")
		}},
		{"include.path to an attacker's config", func(t *testing.T, tree, script string) {
			inc := filepath.Join(t.TempDir(), "evil.config")
			appendFile(t, inc, "[core]\n\tfsmonitor = "+script+"\n\thooksPath = "+filepath.Dir(script)+"\n[filter \"evil\"]\n\tclean = "+script+"\n[diff]\n\texternal = "+script+"\n")
			appendFile(t, filepath.Join(tree, ".gitattributes"), "* filter=evil\n")
			appendFile(t, filepath.Join(tree, ".git", "config"), "[include]\n\tpath = "+inc+"\n")
		}},
		{"hooks in .git/hooks", func(t *testing.T, tree, script string) {
			for _, h := range hooks {
				b, _ := os.ReadFile(script)
				appendFile(t, filepath.Join(tree, ".git", "hooks", h), string(b))
			}
		}},
	}
	for _, c := range cases {
		t.Run(owner+"/"+c.name, func(t *testing.T) {
			if owner == "unprivileged" && os.Geteuid() != 0 {
				citest.SkipOrFail(t, "needs root to hand the draft to another uid")
			}
			f := newFixture(t, 2*time.Second)
			ctx := context.Background()
			base := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks, "instructions.md": "a\nb\nc\nd\ne\nf\n"})
			if _, err := f.svc.Boot(ctx, "s", base); err != nil {
				t.Fatal(err)
			}
			o := NewOps(f.svc, filepath.Join(t.TempDir(), "drafts"))
			if owner == "unprivileged" {
				o.WithOwner(65534, 65534)
			}
			d := opCall(t, o, "behavior.draft", map[string]any{})
			tree := d["path"].(string)
			script, marker := attack(t)
			c.plant(t, tree, script)
			os.WriteFile(filepath.Join(tree, "instructions.md"), []byte("a\nB (draft)\nc\nd\ne\nf\n"), 0o644)
			if owner == "unprivileged" {
				filepath.Walk(tree, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 65534, 65534) })
			}
			diff := opCall(t, o, "behavior.diff", map[string]any{"draft": d["draft"]})
			if b, err := os.ReadFile(marker); err == nil {
				t.Fatalf("behavior.diff ran the cell's program:\n%s", b)
			}
			if !strings.Contains(diff["diff"].(string), "+B (draft)") {
				t.Fatalf("diff: %v", diff)
			}
			newer := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks, "instructions.md": "a\nb\nc\nd\nE (release)\nf\n"})
			if _, err := f.svc.Activate(ctx, "s", 1, newer, "moved on"); err != nil {
				t.Fatal(err)
			}
			if r := opCall(t, o, "behavior.rebase", map[string]any{"draft": d["draft"]}); r["rebased"] != true {
				t.Fatalf("rebase: %v", r)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Fatalf("behavior.rebase ran the cell's program:\n%s", b)
			}
			if b, _ := os.ReadFile(filepath.Join(tree, "instructions.md")); string(b) != "a\nB (draft)\nc\nd\nE (release)\nf\n" {
				t.Fatalf("rebased file: %q", b)
			}
			os.Remove(filepath.Join(tree, ".gitattributes")) // not a behavior file: publication refuses it
			if pub := opCall(t, o, "behavior.publish", map[string]any{"draft": d["draft"]}); pub["release"] == nil {
				t.Fatalf("publish: %v", pub)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Fatalf("behavior.publish ran the cell's program:\n%s", b)
			}
		})
	}
}
