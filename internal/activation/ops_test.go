package activation

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

func opCall(t *testing.T, o *Ops, op string, args any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(args)
	out, err := o.HandleRequest(workbench.WithSession(context.Background(), "s"), worker.Request{Op: op, Args: b})
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var m map[string]any
	json.Unmarshal(out, &m)
	return m
}

// Drafts through the host operations: a draft is a git checkout of the
// active release; behavior.diff shows its changes; a stale draft rebases
// cleanly onto the new active release, and a conflicting one is reported.
func TestDraftOpsDiffAndRebase(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	base := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks, "instructions.md": "a\nb\nc\nd\ne\nf\n"})
	if _, err := f.svc.Boot(ctx, "s", base); err != nil {
		t.Fatal(err)
	}
	o := NewOps(f.svc, filepath.Join(t.TempDir(), "drafts"))
	mk := func() (string, string) {
		d := opCall(t, o, "behavior.draft", map[string]any{})
		if d["git"] != true {
			t.Fatalf("draft: %v", d)
		}
		return d["draft"].(string), d["path"].(string)
	}
	clean, cleanPath := mk()
	conflict, conflictPath := mk()
	os.WriteFile(filepath.Join(cleanPath, "instructions.md"), []byte("a\nB (draft)\nc\nd\ne\nf\n"), 0o644)
	os.WriteFile(filepath.Join(conflictPath, "instructions.md"), []byte("a\nb\nc\nd\nE (draft)\nf\n"), 0o644)
	if d := opCall(t, o, "behavior.diff", map[string]any{"draft": clean}); !strings.Contains(d["diff"].(string), "+B (draft)") {
		t.Fatalf("diff: %v", d)
	}

	// The active release moves on under both drafts.
	newer := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks, "instructions.md": "a\nb\nc\nd\nE (release)\nf\n"})
	if _, err := f.svc.Activate(ctx, "s", 1, newer, "moved on"); err != nil {
		t.Fatal(err)
	}
	r := opCall(t, o, "behavior.rebase", map[string]any{"draft": clean})
	if r["rebased"] != true || r["parent_epoch"].(float64) != 2 {
		t.Fatalf("clean rebase: %v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(cleanPath, "instructions.md")); string(b) != "a\nB (draft)\nc\nd\nE (release)\nf\n" {
		t.Fatalf("rebased file: %q", b)
	}
	r = opCall(t, o, "behavior.rebase", map[string]any{"draft": conflict})
	cs, _ := r["conflicts"].([]any)
	if r["rebased"] != false || len(cs) != 1 || !strings.Contains(cs[0].(map[string]any)["merged"].(string), "E (release)") {
		t.Fatalf("conflicting rebase: %v", r)
	}
	// The clean one publishes and activates against the epoch it was rebased onto.
	pub := opCall(t, o, "behavior.publish", map[string]any{"draft": clean})
	if a := opCall(t, o, "behavior.activate", map[string]any{"release": pub["release"]}); a["epoch"].(float64) != 3 {
		t.Fatalf("activate the rebased draft: %v", a)
	}
}

// A draft whose profile does not parse is refused at behavior.publish,
// naming the file and the reason; with the profile fixed it publishes.
func TestPublishRefusesABadProfile(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	base := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks})
	if _, err := f.svc.Boot(ctx, "s", base); err != nil {
		t.Fatal(err)
	}
	o := NewOps(f.svc, filepath.Join(t.TempDir(), "drafts"))
	d := opCall(t, o, "behavior.draft", map[string]any{})
	path := d["path"].(string)
	os.MkdirAll(filepath.Join(path, "profiles"), 0o755)
	os.WriteFile(filepath.Join(path, "profiles", "review.toml"), []byte("description = \"reviews\"\nroute = \"cheap\"\ntemperature = 0.2\n"), 0o644)
	b, _ := json.Marshal(map[string]any{"draft": d["draft"]})
	_, err := o.HandleRequest(workbench.WithSession(ctx, "s"), worker.Request{Op: "behavior.publish", Args: b})
	var re *worker.RequestError
	if !errors.As(err, &re) || re.Code != "refused" || !strings.Contains(re.Message, "profiles/review.toml") || !strings.Contains(re.Message, "unknown key temperature") {
		t.Fatalf("publish of a bad profile: %v", err)
	}
	os.WriteFile(filepath.Join(path, "profiles", "review.toml"), []byte("description = \"reviews\"\nroute = \"cheap\"\n"), 0o644)
	if pub := opCall(t, o, "behavior.publish", map[string]any{"draft": d["draft"]}); pub["kind"] != "prompt" {
		t.Fatalf("publish of a good profile: %v; want a prompt-only activation", pub)
	}
}
