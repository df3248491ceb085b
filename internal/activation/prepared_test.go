package activation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/pyenv"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// benchFixture is a fixture with a real workbench whose generations are
// offered the skills of the release they start under; starting one under
// a release in failing cannot (its environment cannot be made).
func benchFixture(t *testing.T, failing map[string]bool) (*fixture, *workbench.Manager) {
	f := newFixture(t, 2*time.Second)
	dir := t.TempDir()
	bench := workbench.New(workbench.Config{Store: f.st, Sessions: session.NewManager(f.st), Kernel: env.Kernel,
		Python: env.Python, RuntimeSrc: env.Runtime, Workspace: dir, Placer: env.Placer})
	t.Cleanup(bench.Close)
	bench.SetSkills(func(ctx context.Context, sess, release string) (behavior.SkillSet, string, error) {
		if release == "" {
			s, _ := f.st.Session(ctx, sess)
			release = s.PolicyRevision
		}
		if failing[release] {
			return behavior.SkillSet{}, "", fmt.Errorf("the environment of %s cannot be made", release[:12])
		}
		tree := f.rel.Tree(release)
		set, err := behavior.LoadSkills([]behavior.SkillRoot{{Name: "builtin", Dir: filepath.Join(tree, "skills"), Package: filepath.Join(tree, "klbr_skills")}})
		if err == nil {
			set.Path, err = behavior.Stage(set, filepath.Join(dir, "skillpkg"))
		}
		if err == nil {
			var reqs []string
			if reqs, err = pyenv.Declared(tree); err == nil {
				set.Site, err = f.svc.envs.Path(reqs)
			}
		}
		return set, "", err
	})
	f.svc.SetEnvironments(pyenv.Envs{Root: filepath.Join(dir, "envs"), Wheels: filepath.Join(dir, "wheels"), Python: env.Python})
	bench.SetCrashed(func(sess string, pin store.Pin, reason string) {
		f.svc.WorkerCrashed(context.Background(), sess, pin.Epoch, pin.Release, "workbench", reason)
	})
	f.svc.bench = bench
	return f, bench
}

func cell(t *testing.T, bench *workbench.Manager, code string) (string, int64) {
	t.Helper()
	res, err := bench.Execute(context.Background(), "s", code, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := res.Outcome
	var text string
	if out.Value != nil {
		text = *out.Value
	}
	if out.Error != nil {
		text = out.Error.Type
	}
	return text, out.Generation
}

// A workbench activation starts the new generation and completes its
// handshake before the old one stops; one whose new generation cannot start
// is refused with the reason, and the old generation keeps serving, its
// globals intact.
func TestPreparedSwitch(t *testing.T) {
	bad := map[string]bool{}
	f, bench := benchFixture(t, bad)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publishWithSkill(t, allowHooks, "first")); err != nil {
		t.Fatal(err)
	}
	if _, gen := cell(t, bench, "x = 41"); gen != 1 {
		t.Fatalf("generation %d", gen)
	}

	broken := f.publishWithSkill(t, allowHooks, "needs an environment that cannot be made")
	bad[broken] = true
	_, err := f.svc.Activate(ctx, "s", 1, broken, "broken environment")
	if !errors.Is(err, ErrCandidate) || !strings.Contains(err.Error(), "did not start") || !strings.Contains(err.Error(), "cannot be made") {
		t.Fatalf("activation of a release whose generation cannot start: %v", err)
	}
	if s, _ := f.st.Session(ctx, "s"); s.BehaviorEpoch != 1 {
		t.Fatalf("the refused activation moved the epoch: %+v", s)
	}
	if v, err := f.st.ReleaseValidation(ctx, "s", broken); err != nil || v.OK || !strings.Contains(string(v.Report), "did not start") {
		t.Fatalf("the stored report does not say why: %v %s", err, v.Report)
	}
	if v, gen := cell(t, bench, "x + 1"); v != "42" || gen != 1 {
		t.Fatalf("the old generation does not serve: %q in generation %d", v, gen)
	}

	good := f.publishWithSkill(t, allowHooks, "second")
	res, err := f.svc.Activate(ctx, "s", 1, good, "new skill")
	if err != nil || res.Kind != behavior.KindWorkbench {
		t.Fatalf("%+v %v", res, err)
	}
	// The new generation started (and shook hands) before the old one was reset.
	recs, err := f.st.Records(ctx, "s", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	started, reset := -1, -1
	for i, r := range recs {
		c := string(r.Content)
		switch {
		case r.Kind == "kernel.started" && strings.Contains(c, `"generation":2`):
			started = i
		case r.Kind == "kernel.reset" && strings.Contains(c, `"generation":1`):
			reset = i
		}
	}
	if started < 0 || reset < 0 || started > reset {
		t.Fatalf("generation 2 started at record %d, generation 1 reset at %d", started, reset)
	}
	if v, gen := cell(t, bench, "'x' in globals()"); v != "False" || gen != 2 {
		t.Fatalf("after the switch: %q in generation %d", v, gen)
	}
}

// A release that crashes its worker on every cell is rolled back to the last
// good release by the host, with a notice naming it.
func TestCrashLoopRollsBack(t *testing.T) {
	f, bench := benchFixture(t, nil)
	ctx := context.Background()
	good := f.publishWithSkill(t, allowHooks, "first")
	if _, err := f.svc.Boot(ctx, "s", good); err != nil {
		t.Fatal(err)
	}
	crashing := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks,
		"klbr_skills/__init__.py": "", "klbr_skills/boom.py": "import os\ndef run():\n    os._exit(3)\n"})
	if _, err := f.svc.Activate(ctx, "s", 1, crashing, "a skill that crashes"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for cells := 0; ; cells++ {
		s, _ := f.st.Session(ctx, "s")
		if s.PolicyRevision == good {
			break
		}
		if time.Now().After(deadline) || cells > 20 {
			t.Fatalf("no rollback after %d crashing cells: %+v", cells, s)
		}
		if s.PolicyRevision == crashing {
			// Crashes the worker; the rollback comes off the cell's path, so a
			// cell may already run under the good release (no klbr_skills.boom).
			bench.Execute(ctx, "s", "import klbr_skills.boom as b\nb.run()", nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, _ := f.st.WorkerCrashes(ctx, "s", 2, time.Time{}); n < CrashLoopCount {
		t.Fatalf("rolled back after %d crashes, want %d", n, CrashLoopCount)
	}
	hist, _ := f.st.Activations(ctx, "s")
	if hist[0].Kind != "rollback" || !strings.Contains(hist[0].Reason, "crash loop") || !strings.Contains(hist[0].Reason, crashing[:12]) {
		t.Fatalf("rollback not recorded naming the release: %+v", hist[0])
	}
	recs, _ := f.st.Records(ctx, "s", 0, 1000)
	var notice bool
	for _, r := range recs {
		notice = notice || (r.Kind == "revision.activated" && strings.Contains(string(r.Content), "crash loop"))
	}
	if !notice {
		t.Fatal("no notice names the crash loop")
	}
	if v, _ := cell(t, bench, "1 + 1"); v != "2" {
		t.Fatalf("the last good release does not serve: %q", v)
	}
}

// A release that declares a dependency gets its own environment, staged
// from the local wheel directory before activation (never into the live
// environment); without the wheel it is refused; its generations import it.
func TestReleaseDependenciesAreStaged(t *testing.T) {
	f, bench := benchFixture(t, nil)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publishWithSkill(t, allowHooks, "first")); err != nil {
		t.Fatal(err)
	}
	withDep := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks, "dependencies.json": `{"requires": ["tinypkg==0.1"]}`,
		"klbr_skills/__init__.py": "", "klbr_skills/uses.py": "import tinypkg\n\ndef answer():\n    return tinypkg.ANSWER\n"})
	_, err := f.svc.Activate(ctx, "s", 1, withDep, "needs tinypkg")
	if !errors.Is(err, ErrCandidate) || !strings.Contains(err.Error(), "wheel directory") {
		t.Fatalf("without the wheel: %v", err)
	}
	os.MkdirAll(f.svc.envs.Wheels, 0o755)
	if _, err := workertest.WriteWheel(f.svc.envs.Wheels, "tinypkg", "0.1", map[string]string{"tinypkg/__init__.py": "ANSWER = 42\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Activate(ctx, "s", 1, withDep, "needs tinypkg"); err != nil {
		t.Fatal(err)
	}
	if v, _ := cell(t, bench, "import klbr_skills.uses as u\nu.answer()"); v != "42" {
		t.Fatalf("the generation does not import its dependency: %q", v)
	}
	v, _ := f.st.ReleaseValidation(ctx, "s", withDep)
	var rep Report
	json.Unmarshal(v.Report, &rep)
	if e := rep.Environment; e == nil || len(e.Dependencies) != 64 || len(e.Requires) != 1 || !strings.HasPrefix(e.Site, f.svc.envs.Root) {
		t.Fatalf("fingerprint: %+v", rep.Environment)
	}
}
