package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// behaviorProcs maps each worker role of the daemon on data ("hooks",
// "workbench") to the releases its live processes run, read from their
// environment (KLBR_BEHAVIOR_DIR is <data>/releases/<id>/tree).
func behaviorProcs(t *testing.T, data string) map[string]map[string]bool {
	t.Helper()
	prefix := "KLBR_BEHAVIOR_DIR=" + filepath.Join(data, "releases") + "/"
	out := map[string]map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, []byte(prefix)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if _, after, ok := strings.Cut(string(st), ") "); ok && (strings.HasPrefix(after, "Z") || strings.HasPrefix(after, "X")) {
				continue // exited, not yet reaped
			}
		}
		var role, rel string
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "KLBR_ROLE="); ok {
				role = v
			}
			if v, ok := strings.CutPrefix(kv, prefix); ok {
				rel, _, _ = strings.Cut(v, "/")
			}
		}
		if out[role] == nil {
			out[role] = map[string]bool{}
		}
		out[role][rel] = true
	}
	return out
}

// SIGKILL of klbr-core between a candidate worker's start and the
// activation's commit (seed 004 slice 12), 20 times at varied offsets from
// the instant the candidate's hook worker runs: some kills land before the
// commit, some after. After each restart the session runs the old release
// or the new one, never a mix: the recorded epoch and release, the hook
// worker, the workbench, the attempt's pinned release and the prompt the
// model gets all name the same release, and no input is lost. Odd rounds
// change a skill too (a prepared workbench generation starts before the
// commit), even rounds only hooks and the prompt.
func TestActivationSurvivesSIGKILLBeforeItsCommit(t *testing.T) {
	const rounds = 20
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	a.send("boot")
	a.eventually("the first attempt waits", a.state(store.StateWaiting))
	rels, err := a.c.Releases(t.Context())
	if err != nil || len(rels.Sessions) == 0 {
		t.Fatalf("releases: %+v %v", rels, err)
	}
	base := ""
	for _, r := range rels.Releases {
		if r.ID == rels.Sessions[0].Release {
			base = r.Path
		}
	}
	if _, err := os.Stat(filepath.Join(base, "tree", "soul.md")); err == nil {
		base = filepath.Join(base, "tree")
	}
	initial, err := os.ReadFile(filepath.Join(base, "soul.md"))
	if err != nil {
		t.Fatal(err)
	}
	souls := map[string]string{rels.Sessions[0].Release: strings.TrimSpace(strings.SplitN(string(initial), "\n", 2)[0])}
	committed, kept := 0, 0
	sent := 1
	for i := range rounds {
		rels, err := a.c.Releases(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		old, epoch := rels.Sessions[0].Release, rels.Sessions[0].Epoch
		tree := filepath.Join(t.TempDir(), "tree")
		if err := os.CopyFS(tree, os.DirFS(base)); err != nil {
			t.Fatal(err)
		}
		soul := fmt.Sprintf("You are the soul of round %d.", i)
		edits := map[string]string{
			"soul.md":                    soul + "\n",
			"klbr_hooks/_crash_round.py": fmt.Sprintf("ROUND = %d\n", i), // a hooks change: a candidate worker
		}
		if i%2 == 1 {
			edits["skills/crashround/SKILL.md"] = fmt.Sprintf("# crashround\n\nRound %d: nothing to do.\n", i)
		}
		for name, body := range edits {
			os.MkdirAll(filepath.Dir(filepath.Join(tree, name)), 0o755)
			if err := os.WriteFile(filepath.Join(tree, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		nr, err := a.c.Publish(t.Context(), tree)
		if err != nil {
			t.Fatal(err)
		}
		souls[nr.ID] = soul
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			_, err := a.c.Activate(ctx, "default", api.ActivateRequest{ExpectedEpoch: epoch, Release: nr.ID})
			done <- err
		}()
		a.eventually("the candidate's hook worker runs", func() bool { return behaviorProcs(t, a.data)["hooks"][nr.ID] })
		// Offsets spread over a second; past half the rounds, if every kill
		// so far landed on one side of the commit (a slow or a fast
		// machine), the rest aim at the other side.
		delay := time.Duration(i%10) * 120 * time.Millisecond
		switch {
		case i >= rounds/2 && committed == 0:
			delay = time.Duration(i%10+1) * 600 * time.Millisecond
		case i >= rounds/2 && kept == 0:
			delay = time.Duration(i%3) * 10 * time.Millisecond
		}
		time.Sleep(delay)
		a.kill()
		<-done
		a.start()

		rels, err = a.c.Releases(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		now, nowEpoch := rels.Sessions[0].Release, rels.Sessions[0].Epoch
		switch {
		case now == nr.ID && nowEpoch == epoch+1:
			committed++
		case now == old && nowEpoch == epoch:
			kept++
		default:
			t.Fatalf("round %d: release %s at epoch %d; want %s at %d (old) or %s at %d (new)", i, now[:12], nowEpoch, old[:12], epoch, nr.ID[:12], epoch+1)
		}
		if h := rels.Sessions[0].History; len(h) == 0 || h[0].Release != now || h[0].Epoch != nowEpoch {
			t.Fatalf("round %d: the newest activation record %+v is not the session's release %s at %d", i, h[:min(len(h), 1)], now[:12], nowEpoch)
		}
		a.send(fmt.Sprintf("round %d", i))
		sent++
		want := model.Count() + 1
		a.eventually("the next attempt waits", func() bool { return model.Count() >= want && a.session().State == store.StateWaiting })
		if s := a.session(); s.Attempt == nil || s.Attempt.Release != now {
			t.Fatalf("round %d: the attempt is pinned to %+v, the session runs %s", i, s.Attempt, now[:12])
		}
		if cs := a.kinds(store.LaneCell, "cell.started"); len(cs) == 0 || !strings.Contains(string(cs[len(cs)-1].Content), `"release":"`+now+`"`) {
			t.Fatalf("round %d: the last cell is not pinned to %s", i, now[:12])
		}
		reqs := model.Requests()
		if sys := content(reqs[len(reqs)-1].Messages[0]); !strings.Contains(sys, souls[now]) {
			t.Fatalf("round %d: the prompt is not the soul of %s (%q)", i, now[:12], souls[now])
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			procs := behaviorProcs(t, a.data)
			if len(procs["hooks"]) == 1 && procs["hooks"][now] && len(procs["workbench"]) <= 1 && (len(procs["workbench"]) == 0 || procs["workbench"][now]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the session runs %s; its processes run %v", i, now[:12], procs)
			}
		}
		if got := len(a.kinds(store.LaneInput, "")); got != sent {
			t.Fatalf("round %d: %d inputs, %d acknowledged", i, got, sent)
		}
	}
	t.Logf("%d kills after the candidate worker started: %d after the commit (new release), %d before it (old release)", rounds, committed, kept)
	if kept == 0 || committed == 0 {
		t.Fatalf("the kills did not land on both sides of the commit: %d new, %d old", committed, kept)
	}
}
