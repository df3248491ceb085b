package store

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func spawn(t *testing.T, s *Store, c NewChild) (Spawned, error) {
	t.Helper()
	var sp Spawned
	err := s.Write(context.Background(), func(tx *Tx) (err error) {
		sp, err = tx.SpawnChild(c)
		return err
	})
	return sp, err
}

func count(t *testing.T, s *Store, q string, args ...any) int {
	t.Helper()
	var n int
	if err := s.rdb.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A spawn creates the child's job (running, owned by the parent), its
// session (parent_id set) and its task as its first pending input, together.
func TestSpawnChildCreatesJobSessionAndTask(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	sp, err := spawn(t, s, NewChild{Parent: "default", Task: "investigate the cancellation path", Refs: []string{"e12"},
		Delegate: []string{"local.send"}, Budget: json.RawMessage(`{"tokens":1000}`)})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Session != ChildSessionID(sp.Job) || sp.Depth != 1 {
		t.Fatalf("spawned %+v", sp)
	}
	j, err := s.Job(ctx, sp.Job)
	if err != nil || j.Kind != "child" || j.State != JobRunning || j.Session != "default" || j.Runs != 1 || string(j.Budget) != `{"tokens":1000}` {
		t.Fatalf("job %+v, %v", j, err)
	}
	spec, err := ChildSpecOf(j)
	if err != nil || spec.Session != sp.Session || spec.Task != "investigate the cancellation path" || len(spec.Refs) != 1 || spec.Delegate[0] != "local.send" {
		t.Fatalf("spec %+v, %v", spec, err)
	}
	c, err := s.Session(ctx, sp.Session)
	if err != nil || c.ParentID != "default" || c.State != StateReady {
		t.Fatalf("child session %+v, %v", c, err)
	}
	p, err := s.PendingInputs(ctx, sp.Session)
	if err != nil || len(p) != 1 || !p[0].Directed || p[0].Conversation != "parent" {
		t.Fatalf("child's pending inputs %+v, %v", p, err)
	}
	var body string
	if err := s.rdb.QueryRow(`SELECT json_extract(e.content, '$.text') FROM inputs i JOIN events e ON e.id = i.event_id WHERE i.id = ?`, p[0].ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "investigate the cancellation path") || !strings.Contains(body, "e12") || !strings.Contains(body, "agents.finish") {
		t.Fatalf("task input %q", body)
	}
	if byJob, err := s.ChildJobOf(ctx, sp.Session); err != nil || byJob.ID != sp.Job {
		t.Fatalf("ChildJobOf: %+v, %v", byJob, err)
	}
	if _, err := s.ChildJobOf(ctx, "default"); !errors.Is(err, ErrNoJob) {
		t.Fatalf("ChildJobOf(root): %v, want ErrNoJob", err)
	}
}

// A spawn that fails part of the way leaves nothing behind: no job, no
// session, no input.
func TestSpawnChildIsOneTransaction(t *testing.T) {
	s := newStore(t)
	// The session the first child would get exists: CreateSession fails
	// after the job was inserted.
	mustWrite(t, s, func(tx *Tx) error { return tx.CreateSession(ChildSessionID(1), "") })
	if _, err := spawn(t, s, NewChild{Parent: "default", Task: "x"}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("spawn: %v, want ErrSessionExists", err)
	}
	if n := count(t, s, `SELECT count(*) FROM jobs`); n != 0 {
		t.Fatalf("%d jobs after a failed spawn", n)
	}
	if n := count(t, s, `SELECT count(*) FROM inputs`); n != 0 {
		t.Fatalf("%d inputs after a failed spawn", n)
	}
	if _, err := spawn(t, s, NewChild{Parent: "nobody", Task: "x"}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("spawn from an unknown session: %v", err)
	}
}

// Depth, descendants and concurrent children are checked at spawn, and the
// tree reads back.
func TestSpawnChildLimitsAndTree(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	l := ChildLimits{MaxDepth: 2, MaxDescendants: 3, MaxConcurrent: 2}
	a, err := spawn(t, s, NewChild{Parent: "default", Task: "a", Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	aa, err := spawn(t, s, NewChild{Parent: a.Session, Task: "aa", Limits: l})
	if err != nil || aa.Depth != 2 {
		t.Fatalf("grandchild %+v, %v", aa, err)
	}
	if _, err := spawn(t, s, NewChild{Parent: aa.Session, Task: "aaa", Limits: l}); !errors.Is(err, ErrChildBudget) || !strings.Contains(err.Error(), "agents.max_depth") {
		t.Fatalf("depth 3: %v, want ErrChildBudget naming agents.max_depth", err)
	}
	if _, err := spawn(t, s, NewChild{Parent: "default", Task: "b", Limits: l}); err != nil {
		t.Fatal(err)
	}
	// default has two running children: a third is refused.
	if _, err := spawn(t, s, NewChild{Parent: "default", Task: "c", Limits: ChildLimits{MaxConcurrent: 2}}); !errors.Is(err, ErrChildBudget) || !strings.Contains(err.Error(), "agents.max_concurrent") {
		t.Fatalf("third concurrent child: %v", err)
	}
	// Three descendants under default: a fourth is refused, however deep.
	if _, err := spawn(t, s, NewChild{Parent: a.Session, Task: "ab", Limits: l}); !errors.Is(err, ErrChildBudget) || !strings.Contains(err.Error(), "agents.max_descendants") {
		t.Fatalf("fourth descendant: %v", err)
	}
	kids, err := s.ChildSessions(ctx, "default")
	if err != nil || len(kids) != 2 || kids[0].ID != a.Session {
		t.Fatalf("children of default: %+v, %v", kids, err)
	}
	if n, err := s.Descendants(ctx, "default"); err != nil || n != 3 {
		t.Fatalf("descendants %d, %v", n, err)
	}
	if d, root, err := s.Depth(ctx, aa.Session); err != nil || d != 2 || root != "default" {
		t.Fatalf("depth %d root %q, %v", d, root, err)
	}
	// Ending a child frees its concurrency slot; the refused spawns left no job.
	mustWrite(t, s, func(tx *Tx) error {
		_, err := tx.EndChild(a.Session, JobSucceeded, json.RawMessage(`"ok"`), "", "")
		return err
	})
	if n := count(t, s, `SELECT count(*) FROM jobs WHERE kind = 'child' AND session_id = 'default' AND state = 'running'`); n != 1 {
		t.Fatalf("%d running children of default, want 1", n)
	}
	if n := count(t, s, `SELECT count(*) FROM jobs`); n != 3 {
		t.Fatalf("%d jobs, want 3", n)
	}
}

// A child ends once: its result is recorded, the parent gets one
// notification input and observers one job.succeeded event.
func TestEndChildNotifiesTheParentOnce(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	sp, err := spawn(t, s, NewChild{Parent: "default", Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var j Job
	mustWrite(t, s, func(tx *Tx) (err error) {
		j, err = tx.EndChild(sp.Session, JobSucceeded, json.RawMessage(`{"answer":42}`), "", "[klbr] child 1 succeeded")
		return err
	})
	if j.State != JobSucceeded || string(j.Result) != `{"answer":42}` || j.FinishedAt == nil {
		t.Fatalf("ended %+v", j)
	}
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.EndChild(sp.Session, JobSucceeded, json.RawMessage(`1`), "", "[klbr] again")
		return err
	}); !errors.Is(err, ErrJobState) {
		t.Fatalf("second end: %v, want ErrJobState", err)
	}
	p, err := s.PendingInputs(ctx, "default")
	if err != nil || len(p) != 1 || p[0].SourceKind != "job" {
		t.Fatalf("parent's pending inputs %+v, %v", p, err)
	}
	if n := count(t, s, `SELECT count(*) FROM events WHERE session_id = 'default' AND kind = 'job.succeeded'`); n != 1 {
		t.Fatalf("%d job.succeeded events", n)
	}
}

// steps records n model steps of session, each with prompt and completion tokens.
func steps(t *testing.T, s *Store, session string, n, prompt, completion int) {
	t.Helper()
	mustWrite(t, s, func(tx *Tx) error {
		a, _, err := tx.StartAttempt(NewAttempt{Session: session, WakeReason: "test"})
		if err != nil {
			return err
		}
		for i := range n {
			if _, err := tx.RecordStep(StepResult{Session: session, Attempt: a, Ordinal: i + 1, Started: time.Now(), Route: "main", State: "completed",
				Text: "x", Usage: StepUsage{Prompt: &prompt, Completion: &completion}}); err != nil {
				return err
			}
		}
		return tx.FinishAttempt(a, AttemptIdle, "test")
	})
}

// Usage sums a session's steps and a tree's; a spawn in a tree that has
// spent agents.max_tree_tokens is refused naming the key.
func TestChildUsageAndTreeTokens(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	l := ChildLimits{MaxTreeTokens: 1000}
	a, err := spawn(t, s, NewChild{Parent: "default", Task: "a", Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	b, err := spawn(t, s, NewChild{Parent: a.Session, Task: "b", Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	steps(t, s, "default", 3, 500, 500) // the root's own do not count
	steps(t, s, a.Session, 2, 100, 50)
	steps(t, s, b.Session, 1, 400, 20)
	if u, err := s.SessionUsage(ctx, a.Session); err != nil || (u.ModelRequests != 2 || u.Tokens != 300) {
		t.Fatalf("usage of %s: %+v, %v", a.Session, u, err)
	}
	if u, err := s.TreeUsage(ctx, "default"); err != nil || (u.ModelRequests != 3 || u.Tokens != 720) {
		t.Fatalf("tree usage: %+v, %v", u, err)
	}
	if _, err := spawn(t, s, NewChild{Parent: b.Session, Task: "c", Limits: l}); err != nil {
		t.Fatalf("spawn under the limit: %v", err)
	}
	steps(t, s, b.Session, 1, 280, 0)
	_, err = spawn(t, s, NewChild{Parent: "default", Task: "d", Limits: l})
	if !errors.Is(err, ErrChildBudget) || !strings.Contains(err.Error(), "spent 1000 of 1000 tokens (agents.max_tree_tokens)") {
		t.Fatalf("spawn past the tree's tokens: %v", err)
	}
	var running []Job
	mustWrite(t, s, func(tx *Tx) (err error) { running, err = tx.RunningChildren(a.Session); return err })
	if len(running) != 1 || running[0].ID != b.Job {
		t.Fatalf("running children of %s: %+v", a.Session, running)
	}
	if all, err := s.RunningChildJobs(ctx); err != nil || len(all) != 3 {
		t.Fatalf("running child jobs: %d, %v", len(all), err)
	}
}

// A child's end is, besides job.completed, a child.completed (succeeded)
// or child.failed (anything else) observer event in the parent's session,
// committed with the end: exactly one per child.
func TestChildEndIsAnObserverEvent(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	ok, err := spawn(t, s, NewChild{Parent: "default", Task: "succeed"})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := spawn(t, s, NewChild{Parent: "default", Task: "be cancelled"})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, func(tx *Tx) error {
		if _, err := tx.EndChild(ok.Session, JobSucceeded, json.RawMessage(`{"text":"done","implicit":true}`), "", "n1"); err != nil {
			return err
		}
		_, err := tx.EndChild(bad.Session, JobCancelled, nil, "cancelled", "n2")
		return err
	})
	evs, err := s.ObserverEvents(ctx, "default", []string{"child.completed", "child.failed", "job.completed"}, 0, 1<<62, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]map[string]any{}
	for _, e := range evs {
		var d map[string]any
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		got[e.Kind] = append(got[e.Kind], d)
	}
	if len(got["job.completed"]) != 2 || len(got["child.completed"]) != 1 || len(got["child.failed"]) != 1 {
		t.Fatalf("observer events %v", got)
	}
	c := got["child.completed"][0]
	if c["child"] != ok.Session || c["state"] != "succeeded" || c["implicit"] != true || c["result"].(map[string]any)["text"] != "done" {
		t.Fatalf("child.completed %v", c)
	}
	f := got["child.failed"][0]
	if f["child"] != bad.Session || f["state"] != "cancelled" || f["error"] != "cancelled" || f["job"].(float64) != float64(bad.Job) {
		t.Fatalf("child.failed %v", f)
	}
	if n := count(t, s, `SELECT count(*) FROM observer_events WHERE kind LIKE 'child.%' AND session_id <> 'default'`); n != 0 {
		t.Fatalf("%d child events outside the parent's session", n)
	}
}
