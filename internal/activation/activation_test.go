package activation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// env is the shared worker environment (workertest), set by setupEnv.
var env workertest.Env

func setupEnv(t testing.TB) {
	t.Helper()
	env = workertest.Setup(t)
}

const allowHooks = `
def review(inp):
    return {"decision": "allow", "reason": "fine"}
def plan(inp):
    return {"order": [i["id"] for i in inp["items"]], "defer": [], "reason": "in order"}
SLOTS = {"delivery.review": review, "attention.plan": plan}
`

type fixture struct {
	st   *store.Store
	rel  *behavior.Releases
	hk   *hooks.Dispatcher
	svc  *Service
	soul string
}

func newFixture(t testing.TB, review time.Duration) *fixture {
	t.Helper()
	setupEnv(t)
	dir := t.TempDir()
	t.Cleanup(func() { writable(dir) })
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("s"); return err })
	rel, _ := behavior.Open(filepath.Join(dir, "releases"))
	hk := hooks.New(hooks.Config{Store: st, Releases: rel, Kernel: env.Kernel, Python: env.Python,
		RuntimeSrc: env.Runtime, Workspace: dir, Placer: env.Placer, ReviewDeadline: review})
	t.Cleanup(hk.Close)
	return &fixture{st: st, rel: rel, hk: hk, svc: New(st, rel, hk, nil, nil), soul: "# soul\n"}
}

// writable makes the directories beneath top writable by their owner, so
// that TempDir's removal works where the process is not root (release
// trees are read-only).
func writable(top string) {
	filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if info, err := d.Info(); err == nil {
				os.Chmod(p, info.Mode().Perm()|0o700)
			}
		}
		return nil
	})
}

// publish writes a tree with the given hooks module and soul and publishes it.
func (f *fixture) publish(t testing.TB, hooksPy, soul string) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
	os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(hooksPy), 0o644)
	os.WriteFile(filepath.Join(dir, "soul.md"), []byte(soul), 0o644)
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}

func (f *fixture) review(text string) hooks.Decision {
	return f.hk.Review(context.Background(), "s", hooks.ReviewInput{Channel: "local", Text: text, Session: "s"})
}

func TestActivateCheckSwapRollback(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	a := f.publish(t, allowHooks, "# soul\n")
	res, err := f.svc.Boot(ctx, "s", a)
	if err != nil || res.Epoch != 1 {
		t.Fatalf("boot: %+v %v", res, err)
	}
	if d := f.review("hi"); !d.Allow || d.Fallback || d.Epoch != 1 {
		t.Fatalf("review under A: %+v", d)
	}

	// A hook-only change: a new hook worker, checked first.
	b := f.publish(t, strings.Replace(allowHooks, `"allow", "reason": "fine"`, `"hold", "reason": "policy says no"`, 1), "# soul\n")
	res, err = f.svc.Activate(ctx, "s", 1, b, "stricter")
	if err != nil || res.Kind != behavior.KindHooks || res.Epoch != 2 {
		t.Fatalf("activate B: %+v %v", res, err)
	}
	if d := f.review("hi"); d.Allow || d.Fallback || d.Reason != "policy says no" || d.Epoch != 2 {
		t.Fatalf("review under B: %+v", d)
	}
	// A stale parent is refused.
	if _, err := f.svc.Activate(ctx, "s", 1, a, "stale"); !errors.Is(err, store.ErrStaleEpoch) {
		t.Fatalf("stale parent: %v", err)
	}
	// Broken candidates are refused and the active release keeps working.
	for name, py := range map[string]string{
		"import error":   "import nonexistent_module\n",
		"garbage answer": "SLOTS = {'delivery.review': lambda i: {'verdict': 1}, 'attention.plan': lambda i: {}}\n",
		"raises":         "def f(i):\n    raise RuntimeError('bug')\nSLOTS = {'delivery.review': f, 'attention.plan': f}\n",
	} {
		c := f.publish(t, py, "# soul\n")
		if _, err := f.svc.Activate(ctx, "s", 2, c, name); !errors.Is(err, ErrCandidate) {
			t.Fatalf("%s: %v, want ErrCandidate", name, err)
		}
		if s, _ := f.st.Session(ctx, "s"); s.BehaviorEpoch != 2 || s.PolicyRevision != b {
			t.Fatalf("%s changed the session: %+v", name, s)
		}
		if d := f.review("hi"); d.Reason != "policy says no" {
			t.Fatalf("after refusing %s: %+v", name, d)
		}
	}
	// A prompt-only change replaces no process.
	d := f.publish(t, strings.Replace(allowHooks, `"allow", "reason": "fine"`, `"hold", "reason": "policy says no"`, 1), "# a gentler soul\n")
	res, err = f.svc.Activate(ctx, "s", 2, d, "soul edit")
	if err != nil || res.Kind != behavior.KindPrompt || len(res.Replaced) != 0 {
		t.Fatalf("prompt-only: %+v %v", res, err)
	}
	if dec := f.review("hi"); dec.Epoch != 3 || dec.Reason != "policy says no" {
		t.Fatalf("review after prompt-only: %+v", dec)
	}
	// Rollback returns to the newest earlier release.
	res, err = f.svc.Rollback(ctx, "s")
	if err != nil || res.Release != b || res.Epoch != 4 {
		t.Fatalf("rollback: %+v %v", res, err)
	}
	hist, _ := f.st.Activations(ctx, "s")
	if len(hist) != 4 || hist[0].Kind != "rollback" || hist[3].Kind != "initial" {
		t.Fatalf("history: %+v", hist)
	}
}

func TestReviewFailsClosed(t *testing.T) {
	f := newFixture(t, 2*time.Second) // a fresh worker after "die" starts within it on a loaded machine
	ctx := context.Background()
	hooksPy := `
import time
def review(inp):
    t = inp["text"]
    if t == "raise":
        raise ValueError("review bug")
    if t == "garbage":
        return {"verdict": "sure"}
    if t == "weird":
        return {"decision": "maybe", "reason": "?"}
    if t == "sleep":
        time.sleep(5)
    if t == "die":
        import os
        os._exit(1)
    return {"decision": "allow", "reason": "fine"}
def plan(inp):
    return {"order": [i["id"] for i in inp["items"]], "defer": [], "reason": "x"}
SLOTS = {"delivery.review": review, "attention.plan": plan}
`
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, hooksPy, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ text, reason string }{
		{"raise", "review bug"},
		{"garbage", "not {decision, reason}"},
		{"weird", `"maybe"`},
		{"sleep", "no answer within"},
		{"die", "unavailable"},
	} {
		d := f.review(tc.text)
		if d.Allow || !d.Fallback || !strings.Contains(d.Reason, tc.reason) {
			t.Errorf("%s: %+v, want held with %q", tc.text, d, tc.reason)
		}
		// The next review is served again (a fresh worker where needed).
		if d := f.review("ok"); !d.Allow {
			t.Errorf("after %s: %+v", tc.text, d)
		}
	}
}

func TestPlanFallsBackToTheHostDefault(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	bad := `
def plan(inp):
    return {"order": [], "defer": [{"id": i["id"], "until": 9e9} for i in inp["items"]], "reason": "defer all"}
SLOTS = {"attention.plan": plan, "delivery.review": lambda i: {"decision": "allow", "reason": ""}}
`
	// The candidate check refuses a plan that defers operator input...
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, bad, "# soul\n")); !errors.Is(err, ErrCandidate) {
		t.Fatalf("boot with a plan deferring operators: %v", err)
	}
	// ...and at run time the host default stands in for it.
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, allowHooks, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	in := hooks.PlanInput{Now: 100, Items: []hooks.PlanItem{
		{ID: 3, SourceKind: "discord", ReceivedAt: 99},
		{ID: 2, SourceKind: "discord", Directed: true, ReceivedAt: 50},
		{ID: 1, SourceKind: "operator", ReceivedAt: 98},
	}}
	p := hooks.DefaultPlan(in)
	if fmt.Sprint(p.Order) != "[1 2]" || len(p.Defer) != 1 || p.Defer[0].ID != 3 || p.Defer[0].Until != 107 {
		t.Fatalf("default plan: %+v", p)
	}
	// The naive hook keeps input order, which puts the operator last: the
	// host refuses that plan and uses its default, saying why.
	got := f.hk.Plan(ctx, "s", in)
	if !got.Fallback || fmt.Sprint(got.Order) != "[1 2]" || !strings.Contains(got.Reason, "operator input 1 after other input") {
		t.Fatalf("invalid plan: %+v", got)
	}
	// Given operator input first, the same hook's plan stands.
	in.Items = []hooks.PlanItem{in.Items[2], in.Items[1], in.Items[0]}
	if got := f.hk.Plan(ctx, "s", in); got.Fallback || fmt.Sprint(got.Order) != "[1 2 3]" {
		t.Fatalf("valid plan: %+v", got)
	}
}

func TestCorruptActiveReleaseIsRestoredAtBoot(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	a := f.publish(t, allowHooks, "# soul\n")
	b := f.publish(t, allowHooks, "# another soul\n")
	f.svc.Boot(ctx, "s", a)
	if _, err := f.svc.Activate(ctx, "s", 1, b, "edit"); err != nil {
		t.Fatal(err)
	}
	// Corrupt b on disk.
	p := filepath.Join(f.rel.Tree(b), "soul.md")
	os.Chmod(filepath.Dir(p), 0o755)
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("tampered"), 0o644)
	res, err := f.svc.Boot(ctx, "s", a)
	if err != nil || res.Release != a || res.Epoch != 3 {
		t.Fatalf("boot over a corrupt release: %+v %v", res, err)
	}
	hist, _ := f.st.Activations(ctx, "s")
	if hist[0].Kind != "restore" || !strings.Contains(hist[0].Reason, "failed verification") {
		t.Fatalf("restore not recorded with its reason: %+v", hist[0])
	}
}

// The candidate's own tests run and are recorded with the release, never obeyed.
func TestCandidateOwnTestsAreRecordedNotObeyed(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	a := f.publish(t, allowHooks, "# soul\n")
	if _, err := f.svc.Boot(ctx, "s", a); err != nil {
		t.Fatal(err)
	}
	for name, test := range map[string]string{
		"passing": "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        import klbr_hooks\n        self.assertIn('delivery.review', klbr_hooks.SLOTS)\n",
		"failing": "import unittest\nclass T(unittest.TestCase):\n    def test_claims_success(self):\n        self.fail('the candidate says it passed, but it did not')\n",
	} {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
		os.MkdirAll(filepath.Join(dir, "tests"), 0o755)
		os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(allowHooks+"\n# "+name+"\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "tests", "__init__.py"), nil, 0o644)
		os.WriteFile(filepath.Join(dir, "tests", "test_it.py"), []byte(test), 0o644)
		os.WriteFile(filepath.Join(dir, "soul.md"), []byte("# soul\n"), 0o644)
		m, err := f.rel.Publish(os.DirFS(dir))
		if err != nil {
			t.Fatal(err)
		}
		sess, _ := f.st.Session(ctx, "s")
		_, err = f.svc.Activate(ctx, "s", sess.BehaviorEpoch, m.ID, name)
		switch name {
		case "passing":
			if err != nil {
				t.Fatalf("passing tests refused: %v", err)
			}
		case "failing":
			// The candidate's own tests are not authoritative: their failure is
			// recorded in the host's report, and the host's suite decides.
			if err != nil {
				t.Fatalf("failing own tests refused the candidate (the host suite decides): %v", err)
			}
		}
		v, verr := f.st.ReleaseValidation(ctx, "s", m.ID)
		var rep Report
		json.Unmarshal(v.Report, &rep)
		if verr != nil || !v.OK || !rep.OwnTests.Present || rep.OwnTests.Passed != (name == "passing") ||
			(name == "failing" && !strings.Contains(rep.OwnTests.Tail, "did not")) {
			t.Fatalf("%s: report %v %+v", name, verr, rep.OwnTests)
		}
	}
}

func TestFailingActiveReleaseIsRestoredAtBoot(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	a := f.publish(t, allowHooks, "# soul\n")
	f.svc.Boot(ctx, "s", a)
	// A release whose bytes verify but whose hooks no longer import: the
	// environment changed under it (here: a module it needs disappears).
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
	dep := filepath.Join(t.TempDir(), "fragile_dep.py")
	os.WriteFile(dep, []byte("OK = True\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(
		"import sys\nsys.path.insert(0, "+fmt.Sprintf("%q", filepath.Dir(dep))+")\nimport fragile_dep\n"+allowHooks), 0o644)
	os.WriteFile(filepath.Join(dir, "soul.md"), []byte("# soul\n"), 0o644)
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Activate(ctx, "s", 1, m.ID, "uses a dependency"); err != nil {
		t.Fatal(err)
	}
	os.Remove(dep)
	res, err := f.svc.Boot(ctx, "s", a)
	if err != nil || res.Release != a || res.Epoch != 3 {
		t.Fatalf("boot over a failing release: %+v %v", res, err)
	}
	hist, _ := f.st.Activations(ctx, "s")
	if hist[0].Kind != "restore" || !strings.Contains(hist[0].Reason, "fragile_dep") {
		t.Fatalf("restore not recorded with its reason: %+v", hist[0])
	}
}
