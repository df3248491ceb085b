package activation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	shipped "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
)

// publishTree publishes a tree of files (path → content) with a soul.
func (f *fixture) publishTree(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["soul.md"] = "# soul\n"
	for p, body := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644)
	}
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}

const passingOwnTest = "import unittest\nclass T(unittest.TestCase):\n    def test_fine(self):\n        pass\n"

// Candidates the host's suite refuses although their own tests pass (or
// were deleted): a syntax error, a module that connects at import, a slot
// answering the wrong shape, a required slot left unbound. Each refusal
// leaves the active release serving, and its report is stored.
func TestHostSuiteRefusesWhatOwnTestsPass(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	good := f.publish(t, allowHooks, "# soul\n")
	if _, err := f.svc.Boot(ctx, "s", good); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"syntax error in a skill module", map[string]string{
			"klbr_hooks/__init__.py": allowHooks, "klbr_skills/__init__.py": "", "klbr_skills/broken.py": "def f(:\n",
			"tests/__init__.py": "", "tests/test_ok.py": passingOwnTest}, "import klbr_skills.broken"},
		{"network at import", map[string]string{
			"klbr_hooks/__init__.py": "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9))\nexcept Exception:\n    pass\n" + allowHooks,
			"tests/__init__.py":      "", "tests/test_ok.py": passingOwnTest}, "socket.create_connection"},
		{"wrong shape, own tests deleted", map[string]string{
			"klbr_hooks/__init__.py": strings.Replace(allowHooks, `return {"decision": "allow", "reason": "fine"}`, `return {"verdict": "yes"}`, 1)},
			"delivery.review"},
		{"required slot unbound", map[string]string{
			"klbr_hooks/__init__.py": "def plan(inp):\n    return {'order': [], 'defer': [], 'reason': ''}\nSLOTS = {'attention.plan': plan}\n"},
			"does not bind the required slots delivery.review"},
		{"a process started at import", map[string]string{
			"klbr_hooks/__init__.py": allowHooks, "klbr_skills/__init__.py": "", "klbr_skills/side.py": "import os\nos.system('true')\n"},
			"os.system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rel := f.publishTree(t, tc.files)
			sess, _ := f.st.Session(ctx, "s")
			_, err := f.svc.Activate(ctx, "s", sess.BehaviorEpoch, rel, tc.name)
			if !errors.Is(err, ErrCandidate) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a refusal naming %q", err, tc.want)
			}
			if after, _ := f.st.Session(ctx, "s"); after.PolicyRevision != good || after.BehaviorEpoch != sess.BehaviorEpoch {
				t.Fatalf("a refused candidate changed the session: %+v", after)
			}
			if d := f.review("still serving"); !d.Allow {
				t.Fatalf("the old release stopped serving: %+v", d)
			}
			v, err := f.st.ReleaseValidation(ctx, "s", rel)
			if err != nil || v.OK || !strings.Contains(string(v.Report), tc.want) {
				t.Fatalf("stored report: %v %s", err, v.Report)
			}
		})
	}
}

// Replay: the recorded invocations of each slot run against the candidate,
// and the report lists every decision that would change.
func TestReplayReportsChangedDecisions(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, allowHooks, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"hello", "secret plans", "bye"} {
		if d := f.review(text); !d.Allow {
			t.Fatalf("%s: %+v", text, d)
		}
	}
	stricter := strings.Replace(allowHooks, `    return {"decision": "allow", "reason": "fine"}`,
		`    if "secret" in inp["text"]:
        return {"decision": "hold", "reason": "looks private"}
    return {"decision": "allow", "reason": "fine"}`, 1)
	rel := f.publish(t, stricter, "# soul\n")
	sess, _ := f.st.Session(ctx, "s")
	if _, err := f.svc.Activate(ctx, "s", sess.BehaviorEpoch, rel, "stricter review"); err != nil {
		t.Fatal(err)
	}
	v, err := f.st.ReleaseValidation(ctx, "s", rel)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(v.Report, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Replay.Replayed[hooks.SlotReview] != 3 || rep.Replay.Changed[hooks.SlotReview] != 1 || len(rep.Replay.Changes) != 1 {
		t.Fatalf("replay: %+v", rep.Replay)
	}
	c := rep.Replay.Changes[0]
	if !strings.Contains(string(c.Before), "allow") || !strings.Contains(string(c.After), "looks private") {
		t.Fatalf("change: before %s after %s", c.Before, c.After)
	}
	if rep.Environment == nil || rep.Environment.PythonVersion == "" || len(rep.Environment.Runtime) != 64 {
		t.Fatalf("environment: %+v", rep.Environment)
	}

	// hooks.trace: newest first, each with time, release, epoch, slot,
	// latency, outcome and a ref to its stored input.
	f.review("after")
	f.hk.Flush() // invocation records are written in batches
	tr, err := f.st.HookTrace(ctx, "s", 2, true)
	if err != nil || len(tr) != 2 {
		t.Fatal(tr, err)
	}
	if tr[0].ID <= tr[1].ID || tr[0].Release != rel || tr[0].Epoch != 2 || tr[0].At.IsZero() || tr[0].Slot != hooks.SlotReview ||
		tr[0].Outcome != "ok" || len(tr[0].InputRef) != 64 || !tr[0].InputKept || !strings.Contains(string(tr[0].Input), `"after"`) {
		t.Fatalf("trace: %+v", tr[0])
	}
}

// The suite's report decoder bounds and refuses what does not fit: its
// output is exactly one report line.
func TestParseSuite(t *testing.T) {
	good := `{"ok": true, "slots": ["delivery.review"], "attempts": [], "checks": [{"name": "import klbr_hooks", "ok": true, "detail": ""}]}
`
	r, err := parseSuite([]byte(good))
	if err != nil || !r.OK || len(r.Slots) != 1 || len(r.Checks) != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	for name, bad := range map[string]string{
		"empty":                 "",
		"no newline":            strings.TrimSuffix(good, "\n"),
		"noise before":          "noise from a module\n" + good,
		"a second report":       good + good,
		"truncated":             "{\n",
		"unknown field":         `{"ok": true, "extra": 1}` + "\n",
		"trailing data":         `{"ok": true} {}` + "\n",
		"over the output bound": strings.Repeat("x", maxSuiteOutput+1),
		"over the slots bound":  fmt.Sprintf(`{"slots": [%s"x"]}`, strings.Repeat(`"x",`, maxSuiteSlots)) + "\n",
	} {
		if _, err := parseSuite([]byte(bad)); err == nil {
			t.Errorf("%s: accepted %.60q", name, bad)
		}
	}
}

func FuzzParseSuite(f *testing.F) {
	f.Add([]byte(`{"ok": true, "slots": ["a"], "attempts": ["socket.connect"], "checks": [{"name": "n", "ok": false, "detail": "d"}]}` + "\n"))
	f.Add([]byte("x\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseSuite(b)
		if err != nil {
			return
		}
		if bytes.Count(b, []byte("\n")) != 1 {
			t.Fatalf("accepted %q", b)
		}
		if len(r.Checks) > maxSuiteChecks || len(r.Slots) > maxSuiteSlots {
			t.Fatal("over bounds")
		}
		for _, c := range r.Checks {
			if len(c.Detail) > maxCheckDetail+len("…") {
				t.Fatal("detail over bound")
			}
		}
	})
}

// The host requires every check it expects, each once, and nothing else.
func TestCheckComplete(t *testing.T) {
	dir := t.TempDir()
	for p, body := range map[string]string{"klbr_hooks/__init__.py": "", "klbr_hooks/sub/x.py": "",
		"klbr_hooks/__pycache__/y.py": "", "klbr_hooks/.hidden/z.py": "", "klbr_hooks/notes.txt": "",
		"klbr_skills/__init__.py": "", "klbr_skills/tool.py": "", "skills/a/SKILL.md": "# a\n", "skills/README": ""} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644)
	}
	want, err := expectedChecks(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"import klbr_hooks", "import klbr_hooks.sub.x", "klbr_hooks.SLOTS", "import klbr_skills",
		"import klbr_skills.tool", "skills/a/SKILL.md"}
	if len(want) != len(names) {
		t.Fatalf("expected %v", want)
	}
	var all []Check
	for _, n := range names {
		if !want[n] {
			t.Fatalf("expected %v, lacks %s", want, n)
		}
		all = append(all, Check{Name: n, OK: true})
	}
	if err := checkComplete(want, all); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		checks []Check
		msg    string
	}{
		"missing":    {all[1:], "did not report import klbr_hooks"},
		"duplicated": {append(all[:len(all):len(all)], all[0]), "twice"},
		"unexpected": {append(all[:len(all):len(all)], Check{Name: "import elsewhere", OK: true}), "does not expect"},
	} {
		if err := checkComplete(want, tc.checks); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The shipped behavior tree passes the host's suite, and every slot it
// binds has a fixture the suite checks (a slot added to the host without
// one would be reported "no fixture" here).
func TestShippedTreeEverySlotChecked(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	good := f.publish(t, allowHooks, "# soul\n")
	if _, err := f.svc.Boot(ctx, "s", good); err != nil {
		t.Fatal(err)
	}
	m, err := f.rel.Publish(shipped.Tree())
	if err != nil {
		t.Fatal(err)
	}
	sess, _ := f.st.Session(ctx, "s")
	if _, err := f.svc.Activate(ctx, "s", sess.BehaviorEpoch, m.ID, "the shipped tree"); err != nil {
		t.Fatal(err)
	}
	v, err := f.st.ReleaseValidation(ctx, "s", m.ID)
	if err != nil || !v.OK {
		t.Fatalf("the shipped tree's report: %v %s", err, v.Report)
	}
	var rep Report
	if err := json.Unmarshal(v.Report, &rep); err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	for _, c := range rep.Slots {
		if !c.OK || strings.Contains(c.Detail, "no fixture") {
			t.Errorf("slot %s: %+v", c.Name, c)
		}
		checked[c.Name] = true
	}
	for _, slot := range []string{hooks.SlotReview, hooks.SlotPlan, hooks.SlotJobPlan} {
		if !checked[slot] {
			t.Errorf("the shipped tree's %s was not checked: %+v", slot, rep.Slots)
		}
	}
}
