package agents

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

func newAgents(t *testing.T, l store.ChildLimits) (*Agents, *store.Store, *[]string) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := jobs.New(jobs.Config{Store: st})
	t.Cleanup(m.Close)
	var started []string
	return New(Config{Store: st, Jobs: m, Limits: l, Start: func(s string) { started = append(started, s) }}), st, &started
}

func call(t testing.TB, a *Agents, session, op, args string) (store.Job, error) {
	t.Helper()
	out, err := a.HandleRequest(workbench.WithSession(context.Background(), session), worker.Request{Op: op, Args: json.RawMessage(args)})
	var j store.Job
	if err == nil {
		if jerr := json.Unmarshal(out, &j); jerr != nil {
			t.Fatalf("%s answered %s: %v", op, out, jerr)
		}
	}
	return j, err
}

func code(err error) string {
	var re *worker.RequestError
	if errors.As(err, &re) {
		return re.Code
	}
	return ""
}

// Spawn starts the child's loop; the parent gets, cancels and lists only
// its own children; a cancelled child's session is stopped and it cannot
// finish afterwards.
func TestSpawnCancelAndOwnership(t *testing.T) {
	a, st, started := newAgents(t, store.ChildLimits{MaxConcurrent: 1})
	ctx := context.Background()
	j, err := call(t, a, "default", "agents.spawn", `{"task":"look around","delegate":["local.send","local.send"]}`)
	if err != nil || j.Kind != "child" || j.State != store.JobRunning {
		t.Fatalf("spawn: %+v, %v", j, err)
	}
	if len(*started) != 1 || (*started)[0] != store.ChildSessionID(j.ID) {
		t.Fatalf("started %v", *started)
	}
	spec, _ := store.ChildSpecOf(j)
	if len(spec.Delegate) != 1 {
		t.Fatalf("delegate %v: duplicates kept", spec.Delegate)
	}
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"another"}`); code(err) != "refused" || !strings.Contains(err.Error(), "agents.max_concurrent") {
		t.Fatalf("second spawn: %v, want refused by agents.max_concurrent", err)
	}
	// The child is not its own parent's owner: it cannot read its sibling records.
	if _, err := call(t, a, spec.Session, "agents.get", `{"id":1}`); code(err) != "not_found" {
		t.Fatalf("the child got its own job as a child: %v", err)
	}
	if cur, err := call(t, a, spec.Session, "agents.current", `{}`); err != nil || cur.ID != j.ID {
		t.Fatalf("current: %+v, %v", cur, err)
	}
	c, err := call(t, a, "default", "agents.cancel", `{"id":1}`)
	if err != nil || c.State != store.JobCancelled {
		t.Fatalf("cancel: %+v, %v", c, err)
	}
	if s, _ := st.Session(ctx, spec.Session); s.State != store.StateStopped {
		t.Fatalf("the cancelled child's session is %s", s.State)
	}
	if _, err := call(t, a, spec.Session, "agents.finish", `{"result":1}`); code(err) != "state" {
		t.Fatalf("finish after cancel: %v, want state", err)
	}
	if _, err := call(t, a, "default", "agents.finish", `{"result":1}`); code(err) != "unsupported" {
		t.Fatalf("finish in a root: %v", err)
	}
	out, err := a.HandleRequest(workbench.WithSession(ctx, "default"), worker.Request{Op: "agents.list", Args: json.RawMessage(`{}`)})
	var l struct{ Children []store.Job }
	if err != nil || json.Unmarshal(out, &l) != nil || len(l.Children) != 1 {
		t.Fatalf("list %s, %v", out, err)
	}
}

// A child that finishes wakes its parent once; one that ends its turn
// without finishing ends with its text, marked implicit; Idle ignores roots.
func TestFinishAndIdle(t *testing.T) {
	a, st, _ := newAgents(t, store.ChildLimits{})
	ctx := context.Background()
	one, _ := call(t, a, "default", "agents.spawn", `{"task":"one"}`)
	two, _ := call(t, a, "default", "agents.spawn", `{"task":"two"}`)
	if j, err := call(t, a, store.ChildSessionID(one.ID), "agents.finish", `{"result":{"n":1}}`); err != nil || string(j.Result) != `{"n":1}` {
		t.Fatalf("finish: %+v, %v", j, err)
	}
	a.Idle(ctx, store.ChildSessionID(one.ID), "late text") // already ended: no second end
	a.Idle(ctx, store.ChildSessionID(two.ID), "my last words")
	a.Idle(ctx, "default", "root text")
	j2, _ := st.Job(ctx, two.ID)
	var res struct {
		Text     string
		Implicit bool
	}
	if json.Unmarshal(j2.Result, &res) != nil || !res.Implicit || res.Text != "my last words" {
		t.Fatalf("implicit result %s", j2.Result)
	}
	if j1, _ := st.Job(ctx, one.ID); string(j1.Result) != `{"n":1}` {
		t.Fatalf("the first child's result changed: %s", j1.Result)
	}
	p, err := st.PendingInputs(ctx, "default")
	if err != nil || len(p) != 2 {
		t.Fatalf("parent's notifications %+v, %v; want one per child", p, err)
	}
}

func TestParseSpawnRefuses(t *testing.T) {
	for _, args := range []string{
		`{}`, `{"task":"  "}`, `{"task":"x","profile":"Researcher"}`, `{"task":"x","workspace":"private"}`, `{"task":"x","workspace":1}`,
		`{"task":"x","delegate":["runtime.wakeup"]}`, `{"task":"x","budget":[1]}`, `{"task":"x","refs":[""]}`,
		`{"task":"x","refs":"e1"}`, `[1]`, `{"task":"x","host":1}`, `{"task":"x","host":"` + strings.Repeat("h", MaxHostLen+1) + `"}`,
	} {
		if _, err := parseSpawn(json.RawMessage(args)); code(err) != "invalid" {
			t.Errorf("parseSpawn(%s): %v, want invalid", args, err)
		}
	}
	if a, err := parseSpawn(json.RawMessage(`{"task":"x","workspace":"shared","budget":null}`)); err != nil || string(a.Budget) != "{}" {
		t.Fatalf("parseSpawn: %+v, %v", a, err)
	}
	for _, mode := range []string{"worktree", "read_only"} {
		if a, err := parseSpawn(json.RawMessage(`{"task":"x","workspace":"` + mode + `"}`)); err != nil || a.Workspace != mode {
			t.Fatalf("parseSpawn(workspace %s): %+v, %v", mode, a, err)
		}
	}
	// A child on a host works on a copy: a shared or read-only workspace
	// cannot be honoured there, and is refused, not silently changed.
	for _, tc := range []struct {
		args string
		ok   bool
	}{
		{`{"task":"x","host":"gpu"}`, true}, {`{"task":"x","host":"label:gpu","workspace":"worktree"}`, true},
		{`{"task":"x","host":"gpu","workspace":"shared"}`, false}, {`{"task":"x","host":"gpu","workspace":"read_only"}`, false},
	} {
		a, err := parseSpawn(json.RawMessage(tc.args))
		if err == nil {
			err = checkHostWorkspace(a)
		}
		if (err == nil) != tc.ok || (!tc.ok && code(err) != "invalid") {
			t.Errorf("%s: %v, want ok %v", tc.args, err, tc.ok)
		}
	}
}

func FuzzParseSpawn(f *testing.F) {
	f.Add([]byte(`{"task":"count the widgets","refs":["e1","s2"],"budget":{"tokens":10},"delegate":["local.send"]}`))
	f.Add([]byte(`{"task":"\u0000","refs":[]}`))
	f.Add([]byte(`{"task":"edit","workspace":"worktree"}`))
	f.Add([]byte(`{"task":"read","workspace":"read_only"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := parseSpawn(raw)
		if err != nil {
			if code(err) != "invalid" {
				t.Fatalf("error %v is not invalid", err)
			}
			return
		}
		if ws := a.Workspace; ws != "" && ws != "shared" && ws != "worktree" && ws != "read_only" {
			t.Fatalf("accepted workspace %q", ws)
		}
		if strings.TrimSpace(a.Task) == "" || len(a.Task) > MaxTaskBytes || len(a.Refs) > MaxRefs || len(a.Delegate) > len(Delegable) {
			t.Fatalf("accepted out of bounds: %+v", a)
		}
		for _, d := range a.Delegate {
			if !strings.HasPrefix(d, "local.") && !strings.HasPrefix(d, "discord.") {
				t.Fatalf("delegated %q", d)
			}
		}
	})
}
