package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// rig is a data directory with a store, an artifact store, a workspace and a
// release tree; each manager made on it is a "klbr-core run".
type rig struct {
	t         *testing.T
	dir       string
	st        *store.Store
	arts      *artifacts.Store
	workspace string
	tree      string
	env       workertest.Env
}

const release = "0000000000000000000000000000000000000000000000000000000000000001"

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, dir: t.TempDir(), workspace: t.TempDir(), tree: t.TempDir(), env: workertest.Setup(t)}
	r.open()
	var err error
	if r.arts, err = artifacts.New(filepath.Join(r.dir, "artifacts")); err != nil {
		t.Fatal(err)
	}
	if err := r.st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	// The test release: a module that lives only in this tree.
	os.MkdirAll(filepath.Join(r.tree, "klbr_skills"), 0o755)
	os.WriteFile(filepath.Join(r.tree, "klbr_skills", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(r.tree, "klbr_skills", "testjobs.py"), []byte(testModule), 0o644)
	return r
}

const testModule = `import asyncio
from klbr import jobs

def echo(input):
    return {"said": input.get("text"), "id": jobs.current()["id"]}

async def slow_echo(input):
    await asyncio.sleep(0.05)
    return {"said": input.get("text")}

async def hang(input):
    with open(input["mark"], "a") as f:
        f.write("run\n")
    await jobs.checkpoint({"step": 1})
    await asyncio.sleep(300)

async def checkpointed(input):
    with open(input["mark"], "a") as f:
        f.write("run\n")
    cp = jobs.current()["checkpoint"]
    if cp is None:
        await jobs.checkpoint({"step": 1})
        await asyncio.sleep(300)
    return {"resumed_from": cp}

async def feed(input):
    src = jobs.source()
    cur = src.cursor or 0
    if cur == 0:
        await src.emit([{"key": "e1", "text": "one"}, {"key": "e2", "text": "two"}, {"key": "e3", "text": "three"}], cursor=3)
        await asyncio.sleep(300)
    # After a restart: e3 again (its key is known) and e4.
    r = await src.emit([{"key": "e3", "text": "three"}, {"key": "e4", "text": "four"}], cursor=4)
    return r
`

func (r *rig) open() {
	st, err := store.Open(context.Background(), r.dir, store.Options{})
	if err != nil {
		r.t.Fatal(err)
	}
	r.st = st
	r.t.Cleanup(func() { st.Close() })
}

func (r *rig) manager(t *testing.T) *Manager {
	t.Helper()
	m := New(Config{Store: r.st, Artifacts: r.arts, Kernel: r.env.Kernel, Python: r.env.Python, RuntimeSrc: r.env.Runtime,
		Workspace: r.workspace, Placer: r.env.Placer, Tree: func(string) string { return r.tree }})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func (r *rig) jobInputs(t *testing.T, kind string) []store.InboxItem {
	t.Helper()
	items, err := r.st.Inbox(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	var out []store.InboxItem
	for _, it := range items {
		if it.SourceKind == kind {
			out = append(out, it)
		}
	}
	return out
}

func (r *rig) inputTexts(t *testing.T, kind string) []string {
	t.Helper()
	recs, err := r.st.Records(context.Background(), "default", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rec := range recs {
		if rec.Kind == kind+".input" {
			var c struct{ Text string }
			json.Unmarshal(rec.Content, &c)
			out = append(out, c.Text)
		}
	}
	return out
}

func wait(t *testing.T, m *Manager, id int64) store.Job {
	t.Helper()
	cur, err := m.cfg.Store.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	since := cur.Runs
	if cur.State == store.JobRunning {
		since--
	}
	j, err := m.Wait(context.Background(), id, since, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && strings.HasSuffix(string(b), "\n") {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestTransitionsTable(t *testing.T) {
	all := []store.JobState{store.JobPending, store.JobRunning, store.JobSucceeded, store.JobFailed, store.JobCancelled, store.JobUnknown}
	legal := 0
	for _, from := range all {
		for _, to := range all {
			if CheckTransition(from, to) == nil {
				legal++
				if from.Final() {
					t.Errorf("%s → %s is legal from a final state", from, to)
				}
			}
		}
	}
	if legal != 7 {
		t.Fatalf("%d legal moves, want 7", legal)
	}
}

func TestCommandResultOutputAndOneNotification(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	j, err := m.Run(context.Background(), RunRequest{Session: "default", Spec: CommandSpec{
		Argv: []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"}}})
	if err != nil {
		t.Fatal(err)
	}
	j = wait(t, m, j.ID)
	if j.State != store.JobFailed || !strings.Contains(j.Error, "exit status 3") {
		t.Fatalf("job %s %q, want failed with exit status 3", j.State, j.Error)
	}
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	json.Unmarshal(j.Result, &res)
	if res.ExitCode != 3 || !strings.Contains(j.OutputPreview, "hello") || !strings.Contains(j.OutputPreview, "oops") {
		t.Fatalf("result %s preview %q", j.Result, j.OutputPreview)
	}
	p, err := r.arts.Path(strings.TrimPrefix(j.OutputArtifact, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || !strings.Contains(string(b), "hello") {
		t.Fatalf("artifact %s: %q %v", j.OutputArtifact, b, err)
	}
	texts := r.inputTexts(t, "job")
	if len(texts) != 1 || !strings.HasPrefix(texts[0], "[klbr] job "+strconv.FormatInt(j.ID, 10)+" failed") {
		t.Fatalf("notifications %q, want one [klbr] job %d failed", texts, j.ID)
	}
}

func TestCancelKillsTheWholeTree(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	pidFile := filepath.Join(r.workspace, "pid")
	j, err := m.Run(context.Background(), RunRequest{Session: "default", Spec: CommandSpec{
		Argv: []string{"sh", "-c", "sleep 300 & echo $! > " + pidFile + "; wait"}}})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	if !alive(pid) {
		t.Fatal("the grandchild is not running")
	}
	j, err = m.Cancel(context.Background(), j.ID)
	if err != nil || j.State != store.JobCancelled {
		t.Fatalf("cancel: %s %v", j.State, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(pid) {
		t.Fatalf("grandchild %d outlived the cancel", pid)
	}
}

func TestManualCommandIsUnknownAfterRestartAndNotRunAgain(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	mark, pidFile := filepath.Join(r.workspace, "runs"), filepath.Join(r.workspace, "pid")
	j, err := m.Run(context.Background(), RunRequest{Session: "default", Spec: CommandSpec{
		Argv: []string{"sh", "-c", "echo run >> " + mark + "; sleep 300 & echo $! > " + pidFile + "; wait"}}})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	m.Close() // klbr-core stops: the tree is killed, the row stays running
	if alive(pid) {
		t.Fatalf("a job's process %d outlived klbr-core's stop", pid)
	}
	if got, _ := r.st.Job(context.Background(), j.ID); got.State != store.JobRunning {
		t.Fatalf("after stop the job is %s, want still running (reconciled at start)", got.State)
	}
	m2 := r.manager(t)
	got, _ := r.st.Job(context.Background(), j.ID)
	if got.State != store.JobUnknown {
		t.Fatalf("after restart the job is %s, want unknown", got.State)
	}
	time.Sleep(300 * time.Millisecond)
	if b, _ := os.ReadFile(mark); string(b) != "run\n" {
		t.Fatalf("the command ran %q times, want once", b)
	}
	texts := r.inputTexts(t, "job")
	if len(texts) != 1 || !strings.Contains(texts[0], "unknown") || !strings.Contains(texts[0], "not run again") {
		t.Fatalf("notices %q", texts)
	}
	_ = m2
}

func TestRoutineFromTheReleaseRunsAtItsDeadline(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	at := time.Now().Add(300 * time.Millisecond)
	j, err := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.testjobs:echo",
		Input: json.RawMessage(`{"text":"stand up"}`), Schedule: Schedule{At: at.UnixMilli()}})
	if err != nil {
		t.Fatal(err)
	}
	j = wait(t, m, j.ID)
	if j.State != store.JobSucceeded || j.StartedAt.Before(at.Truncate(time.Millisecond)) {
		t.Fatalf("job %s started %v (due %v): %s", j.State, j.StartedAt, at, j.Error)
	}
	var res struct {
		Said string
		ID   int64
	}
	json.Unmarshal(j.Result, &res)
	if res.Said != "stand up" || res.ID != j.ID {
		t.Fatalf("result %s", j.Result)
	}
	if texts := r.inputTexts(t, "job"); len(texts) != 1 || !strings.Contains(texts[0], "stand up") {
		t.Fatalf("notices %q", texts)
	}
	// A coroutine function is awaited.
	j2, err := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.testjobs:slow_echo",
		Input: json.RawMessage(`{"text":"async"}`), Schedule: Schedule{At: time.Now().UnixMilli()}})
	if err != nil {
		t.Fatal(err)
	}
	if j2 = wait(t, m, j2.ID); j2.State != store.JobSucceeded || !strings.Contains(string(j2.Result), "async") {
		t.Fatalf("async routine: %s %s %s", j2.State, j2.Result, j2.Error)
	}
	// A name that is not in the release fails, and says so.
	j3, _ := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.nothere:x",
		Schedule: Schedule{At: time.Now().UnixMilli()}})
	if j3 = wait(t, m, j3.ID); j3.State != store.JobFailed || !strings.Contains(j3.Error, "nothere") {
		t.Fatalf("missing module: %s %q", j3.State, j3.Error)
	}
}

func TestMissedRecurringDeadlineFiresOnce(t *testing.T) {
	r := newRig(t)
	// A job whose deadline passed an hour ago, every minute: 60 periods missed.
	hourAgo := time.Now().Add(-time.Hour)
	m := New(Config{Store: r.st}) // not started: only to submit
	j, err := m.Submit(context.Background(), store.NewJob{Kind: KindRoutine, Session: "default", Release: release, Recovery: RetrySafe,
		Spec: mustJSON(RoutineSpec{Entry: "klbr_skills.testjobs:echo", Input: json.RawMessage(`{}`)}), Schedule: mustJSON(Schedule{Every: 60000}),
		TZ: "UTC", NextDue: hourAgo})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2 := r.manager(t)
	got, err := m2.Wait(context.Background(), j.ID, 0, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	got, _ = r.st.Job(context.Background(), j.ID)
	if got.Runs != 1 || got.State != store.JobPending || got.NextDue == nil || !got.NextDue.After(time.Now()) {
		t.Fatalf("after the outage: runs %d, %s, next %v; want one run and the next deadline ahead", got.Runs, got.State, got.NextDue)
	}
	// It keeps its phase: the next deadline is a whole number of periods after the missed one.
	if d := got.NextDue.Sub(hourAgo.Truncate(time.Millisecond)); d%time.Minute != 0 || d > time.Hour+time.Minute {
		t.Fatalf("next deadline %v is %v after the missed one", got.NextDue, d)
	}
}

func TestRecoveryByPolicy(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	ctx := context.Background()
	sched := func(entry, recovery string) (store.Job, string) {
		mark := filepath.Join(r.workspace, recovery)
		in, _ := json.Marshal(map[string]string{"mark": mark})
		j, err := m.Schedule(ctx, ScheduleRequest{Session: "default", Release: release, Entry: entry, Input: in,
			Schedule: Schedule{At: time.Now().UnixMilli()}, Recovery: recovery})
		if err != nil {
			t.Fatal(err)
		}
		return j, mark
	}
	manual, manualMark := sched("klbr_skills.testjobs:hang", Manual)
	retry, retryMark := sched("klbr_skills.testjobs:hang", RetrySafe)
	resume, resumeMark := sched("klbr_skills.testjobs:checkpointed", Resume)
	for _, mk := range []string{manualMark, retryMark, resumeMark} {
		waitFile(t, mk)
	}
	// Let the checkpoints commit.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		j, _ := r.st.Job(ctx, resume.ID)
		if j.Checkpoint != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	m.Close()

	m2 := r.manager(t)
	if j, _ := r.st.Job(ctx, manual.ID); j.State != store.JobUnknown {
		t.Fatalf("manual routine is %s after restart, want unknown", j.State)
	}
	if j := wait(t, m2, resume.ID); j.State != store.JobSucceeded || string(j.Result) != `{"resumed_from":{"step":1}}` {
		t.Fatalf("resume routine: %s %s %s", j.State, j.Result, j.Error)
	}
	// The retry_safe routine runs again from the start (and hangs again).
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(retryMark); string(b) == "run\nrun\n" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := os.ReadFile(retryMark); string(b) != "run\nrun\n" {
		t.Fatalf("retry_safe ran %q", b)
	}
	if b, _ := os.ReadFile(manualMark); string(b) != "run\n" {
		t.Fatalf("manual ran %q, want once", b)
	}
	if j, _ := m2.Cancel(ctx, retry.ID); j.State != store.JobCancelled {
		t.Fatalf("cancel retry_safe: %s", j.State)
	}
}

func TestSourceResumesFromItsCursorAndAdmitsNoEventTwice(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	ctx := context.Background()
	j, err := m.Schedule(ctx, ScheduleRequest{Session: "default", Release: release, Kind: KindSource, Entry: "klbr_skills.testjobs:feed",
		Schedule: Schedule{At: time.Now().UnixMilli()}, Recovery: Resume})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(r.jobInputs(t, "source")) < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	m.Close() // killed mid-run, after its first emit
	if got, _ := r.st.Job(ctx, j.ID); string(got.Cursor) != "3" {
		t.Fatalf("cursor after the first emit: %s", got.Cursor)
	}
	m2 := r.manager(t)
	got := wait(t, m2, j.ID)
	if got.State != store.JobSucceeded || string(got.Cursor) != "4" {
		t.Fatalf("source after restart: %s cursor %s (%s)", got.State, got.Cursor, got.Error)
	}
	texts := r.inputTexts(t, "source")
	if strings.Join(texts, ",") != "one,two,three,four" {
		t.Fatalf("admitted %q, want each event once", texts)
	}
	if !strings.Contains(string(got.Result), `"duplicates":1`) {
		t.Fatalf("result %s", got.Result)
	}
}

func TestScheduleRefusesWhatItCannotKeep(t *testing.T) {
	r := newRig(t)
	m := r.manager(t)
	for _, req := range []ScheduleRequest{
		{Entry: "os:system", Schedule: Schedule{}},
		{Entry: "not an entry", Schedule: Schedule{At: 1}},
		{Entry: "klbr_skills.x:y", Schedule: Schedule{Every: 10}},
		{Entry: "klbr_skills.x:y", Schedule: Schedule{Cron: "61 * * * *"}},
		{Entry: "klbr_skills.x:y", Schedule: Schedule{Cron: "0 9 * * 1"}, TZ: "Mars/Olympus"},
		{Entry: "klbr_skills.x:y", Schedule: Schedule{At: 1, Every: 1000}},
	} {
		req.Session, req.Release = "default", release
		if _, err := m.Schedule(context.Background(), req); err == nil {
			t.Errorf("%+v was accepted", req)
		}
	}
	if _, err := m.Schedule(context.Background(), ScheduleRequest{Session: "nosuch", Release: release, Entry: "a:b", Schedule: Schedule{At: 1}}); err == nil ||
		errors.Is(err, ErrRefused) {
		t.Errorf("a job for a missing session: %v", err)
	}
}
