package activation

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	shipped "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/workbench"
)

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)]
}

// BenchmarkHooks measures, in one run, the delivery.review round trip and
// the time of a hook-only activation against an activation that replaces the
// workbench (until the new generation has run its first cell).
func BenchmarkHooks(b *testing.B) {
	ctx := context.Background()
	b.Run("op=review", func(b *testing.B) {
		f := newFixture(b, 2*time.Second)
		if _, err := f.svc.Boot(ctx, "s", f.publish(b, allowHooks, "# soul\n")); err != nil {
			b.Fatal(err)
		}
		f.review("warm up")
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t := time.Now()
			if d := f.review("hello"); !d.Allow {
				b.Fatalf("%+v", d)
			}
			lat = append(lat, time.Since(t))
		}
		b.ReportMetric(float64(percentile(lat, .5).Microseconds()), "p50-us")
		b.ReportMetric(float64(percentile(lat, .99).Microseconds()), "p99-us")
	})
	// model.plan: the hook a step asks before its model request.
	b.Run("op=model.plan", func(b *testing.B) {
		f := newFixture(b, 2*time.Second)
		if _, err := f.svc.Boot(ctx, "s", f.publish(b, planHooks, "# soul\n")); err != nil {
			b.Fatal(err)
		}
		in := planInput("turn", false)
		f.hk.PlanModel(ctx, in)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t := time.Now()
			if p := f.hk.PlanModel(ctx, in); p.Fallback {
				b.Fatalf("%+v", p)
			}
			lat = append(lat, time.Since(t))
		}
		b.ReportMetric(float64(percentile(lat, .5).Microseconds()), "p50-us")
		b.ReportMetric(float64(percentile(lat, .99).Microseconds()), "p99-us")
	})
	// kind=workbench is the prepared switch; switch=lazy is the switch as it
	// was before it (the old generation reset at the boundary, the new one
	// started by the next cell), run side by side.
	for _, kind := range []string{"prompt", "hooks", "workbench", "workbench/switch=lazy"} {
		b.Run("op=activate/kind="+kind, func(b *testing.B) {
			f := newFixture(b, 2*time.Second)
			dir := b.TempDir()
			bench := workbench.New(workbench.Config{Store: f.st, Sessions: session.NewManager(f.st), Kernel: env.Kernel,
				Python: env.Python, RuntimeSrc: env.Runtime, Workspace: dir, Placer: env.Placer, Artifacts: mustArtifacts(b, dir)})
			defer bench.Close()
			f.svc.bench = bench
			want := kind
			if kind == "workbench/switch=lazy" {
				f.svc.bench = lazyBench{bench}
				want = "workbench"
			}
			if _, err := f.svc.Boot(ctx, "s", f.publish(b, allowHooks, "# soul\n")); err != nil {
				b.Fatal(err)
			}
			if _, err := bench.Execute(ctx, "s", "x = 1", nil); err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				// Each release differs from the last in the component under test.
				hooksPy := allowHooks + "\n# variant " + strings.Repeat("x", i%7) + time.Now().String() + "\n"
				var rel string
				switch want {
				case "prompt":
					rel = f.publish(b, allowHooks, "# soul "+time.Now().String()+"\n")
				case "hooks":
					rel = f.publish(b, hooksPy, "# soul\n")
				default:
					rel = f.publishWithSkill(b, allowHooks, time.Now().String())
				}
				sess, _ := f.st.Session(ctx, "s")
				b.StartTimer()
				t := time.Now()
				res, err := f.svc.Activate(ctx, "s", sess.BehaviorEpoch, rel, "bench")
				if err != nil || string(res.Kind) != want {
					b.Fatalf("activate: %+v %v", res, err)
				}
				// Ready again: a cell runs (in a new generation after a workbench replacement).
				out, err := bench.Execute(ctx, "s", "1", nil)
				if err != nil || out.Outcome.Status != "ok" {
					b.Fatalf("cell after activation: %+v %v", out, err)
				}
				lat = append(lat, time.Since(t))
			}
			b.ReportMetric(float64(percentile(lat, .5).Milliseconds()), "p50-ms")
		})
	}
}

// lazyBench offers only ResetAtBoundary: the switch without preparation.
type lazyBench struct{ m *workbench.Manager }

func (l lazyBench) ResetAtBoundary(session, reason string) { l.m.ResetAtBoundary(session, reason) }

// BenchmarkValidation measures a candidate's validation (host suite,
// fixtures, replay, own tests) with 0, 100 and 1,000 recorded
// delivery.review invocations to replay.
func BenchmarkValidation(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{0, 100, 1000} {
		b.Run(fmt.Sprintf("replay=%d", n), func(b *testing.B) {
			f := newFixture(b, 2*time.Second)
			if _, err := f.svc.Boot(ctx, "s", f.publish(b, allowHooks, "# soul\n")); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				if d := f.review(fmt.Sprintf("message %d", i)); !d.Allow {
					b.Fatalf("%+v", d)
				}
			}
			old := ReplayN
			ReplayN = max(n, 1)
			defer func() { ReplayN = old }()
			rel := f.publish(b, allowHooks+"\n# candidate\n", "# soul\n")
			var took, replay time.Duration
			b.ResetTimer()
			for range b.N {
				rep, w, err := f.svc.Validate(ctx, "s", rel)
				if err != nil || rep.Replay.Replayed["delivery.review"] != n {
					b.Fatalf("%+v %v", rep.Replay, err)
				}
				w.Kill()
				took += time.Duration(rep.TookMS * float64(time.Millisecond))
				replay += time.Duration(rep.Replay.TookMS * float64(time.Millisecond))
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "validate-ms")
			b.ReportMetric(float64(replay.Milliseconds())/float64(b.N), "replay-ms")
		})
	}
}

// BenchmarkValidationShippedTree measures the validation of the shipped
// behavior tree (every module of klbr_hooks and klbr_skills imported by the
// host suite), with nothing recorded to replay.
func BenchmarkValidationShippedTree(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b, 2*time.Second)
	if _, err := f.svc.Boot(ctx, "s", f.publish(b, allowHooks, "# soul\n")); err != nil {
		b.Fatal(err)
	}
	m, err := f.rel.Publish(shipped.Tree())
	if err != nil {
		b.Fatal(err)
	}
	var took time.Duration
	b.ResetTimer()
	for range b.N {
		rep, w, err := f.svc.Validate(ctx, "s", m.ID)
		if err != nil {
			b.Fatalf("%+v %v", rep, err)
		}
		w.Kill()
		took += time.Duration(rep.TookMS * float64(time.Millisecond))
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "validate-ms")
}

func mustArtifacts(b *testing.B, dir string) *artifacts.Store {
	a, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		b.Fatal(err)
	}
	return a
}

// publishWithSkill publishes a tree whose skill text differs by body.
func (f *fixture) publishWithSkill(t testing.TB, hooksPy, body string) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
	os.MkdirAll(filepath.Join(dir, "skills", "note"), 0o755)
	os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(hooksPy), 0o644)
	os.WriteFile(filepath.Join(dir, "soul.md"), []byte("# soul\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "skills", "note", "SKILL.md"), []byte("# note\n"+body+"\n"), 0o644)
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}
