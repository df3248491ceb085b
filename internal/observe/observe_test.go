package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// base is the two required slots; observers are added per test.
const base = `
import json, os, time
SLOTS = {
    "attention.plan": lambda i: {"order": [x["id"] for x in i["items"]], "defer": [], "reason": ""},
    "delivery.review": lambda i: {"decision": "allow", "reason": "ok"},
}
`

type fixture struct {
	t   testing.TB
	dir string
	st  *store.Store
	rel *behavior.Releases
	hk  *hooks.Dispatcher
	svc *activation.Service
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := newFixtureAt(t, t.TempDir())
	t.Cleanup(f.close)
	return f
}

// newFixtureAt opens the store in dir (a crash test reopens it); close
// closes it.
func newFixtureAt(t testing.TB, dir string) *fixture {
	t.Helper()
	env := workertest.Setup(t)
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("s"); return err })
	rel, _ := behavior.Open(filepath.Join(dir, "releases"))
	hk := hooks.New(hooks.Config{Store: st, Releases: rel, Kernel: env.Kernel, Python: env.Python,
		RuntimeSrc: env.Runtime, Workspace: dir, Placer: env.Placer})
	return &fixture{t: t, dir: dir, st: st, rel: rel, hk: hk, svc: activation.New(st, rel, hk, nil, nil)}
}

func (f *fixture) close() {
	if f.hk != nil {
		f.hk.Close()
		f.st.Close()
		f.hk = nil
	}
}

// release publishes a tree with hooks code and settings and activates it.
func (f *fixture) release(code, settings string) string {
	f.t.Helper()
	dir := f.t.TempDir()
	os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
	os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(base+code), 0o644)
	os.WriteFile(filepath.Join(dir, "soul.md"), []byte("# soul\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "settings.toml"), []byte(settings), 0o644)
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx := context.Background()
	s, _ := f.st.Session(ctx, "s")
	if s.PolicyRevision == "" {
		_, err = f.svc.Boot(ctx, "s", m.ID)
	} else {
		_, err = f.svc.Activate(ctx, "s", s.BehaviorEpoch, m.ID, "test")
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return m.ID
}

var keys int

func (f *fixture) admit(text string) {
	f.t.Helper()
	keys++
	now := time.Now()
	if err := f.st.Write(context.Background(), func(tx *store.Tx) error {
		_, err := tx.AdmitInput(store.NewInput{Session: "s", SourceKind: "operator", SourceKey: fmt.Sprintf("k%d-%d", keys, now.UnixNano()),
			Conversation: "operator", Author: "operator", Directed: true, OccurredAt: now, ReceivedAt: now, Body: text})
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
}

// drain runs passes until one changes nothing and nothing is due.
func (f *fixture) drain(r *Runner) {
	f.t.Helper()
	last := ""
	for range 500 {
		if _, err := r.Pass(context.Background(), "s"); err != nil {
			f.t.Fatal(err)
		}
		stats, _ := f.st.ObserverStats(context.Background())
		recs, _ := f.st.Records(context.Background(), "s", 0, 1000)
		busy := false
		for _, s := range stats {
			busy = busy || s.Backlog > 0 && s.Paused == ""
		}
		fp := fmt.Sprint(stats, len(recs))
		if !busy && fp == last {
			return
		}
		last = fp
	}
}

func (f *fixture) speech() []store.Record {
	f.t.Helper()
	recs, err := f.st.Records(context.Background(), "s", 0, 1000)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []store.Record
	for _, r := range recs {
		if r.Lane == store.LaneSpeech {
			out = append(out, r)
		}
	}
	return out
}

func (f *fixture) notices(kind string) int {
	recs, _ := f.st.Records(context.Background(), "s", 0, 1000)
	n := 0
	for _, r := range recs {
		if r.Kind == kind {
			n++
		}
	}
	return n
}

const counter = `
def count(inp):
    ev, st = inp["event"], inp["state"]
    n = st.get("n", 0) + 1
    return {"state": {"n": n}, "commands": [{"op": "local.send", "args": {"text": "seen %d: %s" % (n, ev["data"].get("text"))}}]}
SLOTS["notes.count"] = count
`

const counterSettings = `
[[hooks.observers]]
handler = "notes.count"
events = ["input.accepted"]
state_version = 1
`

// An observer gets each committed input with its state; its answer's state
// and command commit with the acknowledgement, and the command is a
// reviewed local send with a receipt naming its cause and handler.
func TestObserverStateAndCommands(t *testing.T) {
	f := newFixture(t)
	f.admit("before the binding") // history: never delivered
	f.release(counter, counterSettings)
	r := New(Config{Store: f.st, Hooks: f.hk})
	f.drain(r)
	f.admit("one")
	f.admit("two")
	f.drain(r)
	sp := f.speech()
	if len(sp) != 2 || !strings.Contains(string(sp[0].Content), "seen 1: one") || !strings.Contains(string(sp[1].Content), "seen 2: two") {
		t.Fatalf("speech: %v", sp)
	}
	var c struct {
		Observer string `json:"observer"`
		Cause    int64  `json:"cause_event"`
		Status   string `json:"status"`
	}
	json.Unmarshal(sp[0].Content, &c)
	if c.Observer != "notes.count" || c.Cause == 0 || c.Status != "confirmed" {
		t.Errorf("a command's send names its cause and handler: %s", sp[0].Content)
	}
	state, v, _ := f.st.HookState(context.Background(), "s", "notes.count")
	if string(state) != `{"n":2}` || v != 1 {
		t.Errorf("state %s v%d", state, v)
	}
	// A new revision of the handler does not redeliver completed history.
	f.release(counter+"\n# a new revision\n", counterSettings)
	f.drain(r)
	if n := len(f.speech()); n != 2 {
		t.Errorf("a new revision redelivered history: %d sends", n)
	}
	f.admit("three")
	f.drain(r)
	if sp := f.speech(); len(sp) != 3 || !strings.Contains(string(sp[2].Content), "seen 3: three") {
		t.Errorf("after the new revision: %v", sp)
	}
	// A release that changes the state's schema without declaring a
	// migration pauses the observer with a notice; declaring one resumes it.
	f.release(counter, strings.Replace(counterSettings, "state_version = 1", "state_version = 2", 1))
	f.admit("four")
	f.drain(r)
	if n := len(f.speech()); n != 3 || f.notices("hooks.observer_paused") != 1 {
		t.Errorf("an undeclared state migration: %d sends, %d pause notices", n, f.notices("hooks.observer_paused"))
	}
	f.release(counter, strings.Replace(counterSettings, "state_version = 1", "state_version = 2\nmigrates_from = [1]", 1))
	f.drain(r)
	if sp := f.speech(); len(sp) != 4 || !strings.Contains(string(sp[3].Content), "seen 4: four") {
		t.Errorf("after a declared migration: %v", sp)
	}
}

// An observer that sends whenever a message is sent stops at the causal
// depth limit with a visible notice.
func TestSendOnSendStopsAtTheDepthLimit(t *testing.T) {
	f := newFixture(t)
	f.release(`
def echo(inp):
    return {"commands": [{"op": "local.send", "args": {"text": "echo of " + str(inp["event"]["id"])}}]}
def first(inp):
    return {"commands": [{"op": "local.send", "args": {"text": "first"}}]}
SLOTS["loop.echo"] = echo
SLOTS["loop.first"] = first
`, `
[[hooks.observers]]
handler = "loop.echo"
events = ["delivery.receipt"]
[[hooks.observers]]
handler = "loop.first"
events = ["input.accepted"]
`)
	r := New(Config{Store: f.st, Hooks: f.hk, Limits: store.LoopLimits{MaxDepth: 3, Quota: 100, Window: time.Minute}})
	f.drain(r)
	f.admit("go")
	f.drain(r)
	// first (depth 1), then echoes of depth 2 and 3; the echo of the depth-3
	// receipt is refused.
	if n := len(f.speech()); n != 3 {
		t.Fatalf("%d sends, want 3 (depth limit 3)", n)
	}
	if f.notices("hooks.loop_limit") != 1 {
		t.Fatalf("no loop-limit notice")
	}
	stats, _ := f.st.ObserverStats(context.Background())
	for _, s := range stats {
		if s.Handler == "loop.echo" && s.Refused != 1 {
			t.Errorf("echo stats: %+v", s)
		}
	}
	// The quota bounds a window too.
	r.cfg.Limits = store.LoopLimits{MaxDepth: 100, Quota: 5, Window: time.Minute}
	f.admit("again")
	f.drain(r)
	if n := len(f.speech()); n != 5 {
		t.Errorf("%d sends in the window, want the quota of 5", n)
	}
}

// A failing observer is retried with backoff, then dead-lettered with a
// notice; a slow or malformed one too; deliveries after it go on.
func TestFailingObserverDeadLetters(t *testing.T) {
	f := newFixture(t)
	f.release(`
def flaky(inp):
    t = inp["event"]["data"].get("text")
    if t == "raise":
        raise ValueError("observer bug")
    if t == "garbage":
        return {"commands": [{"op": "rm -rf"}]}
    if t == "sleep":
        time.sleep(5)
    if t == "die":
        os._exit(1)
    return {"state": {"last": t}}
SLOTS["flaky.obs"] = flaky
`, "[[hooks.observers]]\nhandler = \"flaky.obs\"\nevents = [\"input.accepted\"]\n")
	r := New(Config{Store: f.st, Hooks: f.hk, MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	f.drain(r)
	for _, m := range []string{"raise", "garbage", "sleep", "die", "fine"} {
		f.admit(m)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		f.drain(r)
		stats, _ := f.st.ObserverStats(context.Background())
		if len(stats) == 1 && stats[0].Backlog == 0 {
			if stats[0].DeadLetters != 4 || stats[0].Done != 1 {
				t.Fatalf("stats: %+v", stats[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats: %+v", stats)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.notices("hooks.dead_letter"); n != 4 {
		t.Errorf("%d dead-letter notices", n)
	}
	if st, _, _ := f.st.HookState(context.Background(), "s", "flaky.obs"); string(st) != `{"last":"fine"}` {
		t.Errorf("state %s", st)
	}
}

// An observer's Discord commands go through the outbox under the key
// o<command id>: carried out once however often the runner looks, held by
// delivery.review like a cell's, and, with no transport to settle them,
// honestly pending (not delivered). A mark is recorded with its observer.
func TestObserverDiscordCommands(t *testing.T) {
	f := newFixture(t)
	f.release(`
def relay(inp):
    d = inp["event"]["data"]
    if d.get("source_kind") != "discord":
        return {}
    return {"commands": [
        {"op": "discord.send", "args": {"conversation": d["conversation"], "text": "relayed: " + d["text"]}},
        {"op": "discord.send", "args": {"conversation": d["conversation"], "text": "   "}},
        {"op": "discord.mark", "args": {"item_id": 1, "status": "seen", "note": "relayed"}},
    ]}
SLOTS["relay.obs"] = relay
SLOTS["delivery.review"] = lambda i: {"decision": "hold" if not i["text"].strip() else "allow", "reason": "policy"}
`, "[[hooks.observers]]\nhandler = \"relay.obs\"\nevents = [\"input.accepted\"]\n")
	r := New(Config{Store: f.st, Hooks: f.hk})
	f.drain(r)
	ctx := context.Background()
	if err := f.st.Write(ctx, func(tx *store.Tx) error {
		now := tx.Now()
		a, err := tx.AdmitInput(store.NewInput{Session: "s", SourceKind: "discord", SourceKey: "discord:5001",
			Conversation: store.ConversationKey("77"), Author: "u1", Directed: true, OccurredAt: now, ReceivedAt: now, Body: "hello"})
		if err != nil {
			return err
		}
		_, err = tx.RecordDiscordMessage(a, store.DiscordMessage{Session: "s", MessageID: "5001", ChannelID: "77", ChannelKind: "dm",
			AuthorID: "u1", Mode: "dm"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.drain(r)
	f.drain(r)
	cmds, _ := f.st.ObserverCommands(ctx, "s")
	if len(cmds) != 3 {
		t.Fatalf("commands: %+v", cmds)
	}
	for _, c := range cmds {
		if c.State != "done" || c.Handler != "relay.obs" || c.CauseEvent == 0 {
			t.Errorf("command: %+v", c)
		}
	}
	sent, err := f.st.Effect(ctx, cmds[0].EffectID)
	if err != nil || sent.State != store.EffectPending || sent.Text != "relayed: hello" {
		t.Errorf("the relayed send: %+v %v (pending: no transport has it, so not delivered)", sent, err)
	}
	held, err := f.st.Effect(ctx, cmds[1].EffectID)
	if err != nil || held.State != store.EffectHeld || held.ErrorCode != "held" {
		t.Errorf("the blank send: %+v %v, want held by delivery.review", held, err)
	}
	it, _ := f.st.AttentionItem(ctx, 1)
	if it.Status != store.ItemSeen || !strings.Contains(it.Note, "observer relay.obs") {
		t.Errorf("the item: %+v", it)
	}
	// The held send's receipt is an event one level deeper, with its cause.
	evs, _ := f.st.ObserverEvents(ctx, "s", []string{"delivery.receipt"}, 0, 0, 10)
	if len(evs) != 1 || evs[0].Depth != 1 || evs[0].CauseCommand != cmds[1].ID {
		t.Errorf("receipt events: %+v", evs)
	}
}

// turn.completed and revision.activated reach a bound observer, each once,
// with their data.
func TestTurnAndRevisionEvents(t *testing.T) {
	f := newFixture(t)
	code := `
def seen(inp):
    kinds = inp["state"].get("kinds", [])
    d = inp["event"]["data"]
    return {"state": {"kinds": kinds + [inp["event"]["kind"] + ":" + str(d.get("state") or d.get("kind"))]}}
SLOTS["log.seen"] = seen
`
	settings := "[[hooks.observers]]\nhandler = \"log.seen\"\nevents = [\"turn.completed\", \"revision.activated\"]\n"
	f.release(code, settings)
	r := New(Config{Store: f.st, Hooks: f.hk})
	f.drain(r)
	ctx := context.Background()
	if err := f.st.Write(ctx, func(tx *store.Tx) error {
		id, _, err := tx.StartAttempt(store.NewAttempt{Session: "s", WakeReason: "test"})
		if err != nil {
			return err
		}
		return tx.FinishAttempt(id, store.AttemptIdle, "done")
	}); err != nil {
		t.Fatal(err)
	}
	f.release(code+"\n# next revision\n", settings) // the handler stays bound: it sees this activation
	f.drain(r)
	st, _, _ := f.st.HookState(ctx, "s", "log.seen")
	if string(st) != `{"kinds":["turn.completed:idle","revision.activated:hooks"]}` {
		t.Errorf("state %s", st)
	}
}

// A slow observer runs in a worker of its own: the turn loop's hooks are
// answered meanwhile, and none of them is timed out (or its worker killed).
func TestSlowObserverDoesNotHoldUpTheLoopsHooks(t *testing.T) {
	f := newFixture(t)
	f.release(`
def slow(inp):
    time.sleep(1.5)
    return {}
SLOTS["slow.obs"] = slow
`, "[[hooks.observers]]\nhandler = \"slow.obs\"\nevents = [\"input.accepted\"]\n")
	r := New(Config{Store: f.st, Hooks: f.hk})
	f.drain(r)
	f.admit("x")
	done := make(chan struct{})
	go func() { defer close(done); f.drain(r) }()
	time.Sleep(300 * time.Millisecond) // the observer sleeps in its worker
	start := time.Now()
	p := f.hk.Plan(context.Background(), "s", hooks.PlanInput{Now: 2, Items: []hooks.PlanItem{{ID: 1, SourceKind: "operator", ReceivedAt: 1}}})
	if p.Fallback || time.Since(start) > time.Second {
		t.Errorf("attention.plan during a slow observer: %+v after %s", p, time.Since(start))
	}
	<-done
	stats, _ := f.st.ObserverStats(context.Background())
	if len(stats) != 1 || stats[0].Done != 1 {
		t.Errorf("stats: %+v", stats)
	}
}

// A job's run that ends is a job.completed event, committed with the end: an
// observer bound to it sees a recurring job's run (back to pending) and a
// one-shot's failure, with their state, run, result and output.
func TestJobCompletedEvents(t *testing.T) {
	f := newFixture(t)
	code := `
def job(inp):
    d = inp["event"]["data"]
    seen = inp["state"].get("seen", [])
    return {"state": {"seen": seen + ["%s:%s:%s:%s:%s" % (d["job"], d["state"], d["run"], d.get("result"), d["output_preview"])]}}
SLOTS["jobs.seen"] = job
`
	f.release(code, "[[hooks.observers]]\nhandler = \"jobs.seen\"\nevents = [\"job.completed\"]\n")
	r := New(Config{Store: f.st, Hooks: f.hk})
	f.drain(r)
	ctx := context.Background()
	var every, once int64
	if err := f.st.Write(ctx, func(tx *store.Tx) (err error) {
		if every, err = tx.InsertJob(store.NewJob{Kind: "routine", Session: "s", Spec: json.RawMessage(`{"entry":"a:b","input":{}}`),
			Recovery: "retry_safe", Schedule: json.RawMessage(`{"every":60000}`)}); err != nil {
			return err
		}
		once, err = tx.InsertJob(store.NewJob{Kind: "command", Session: "s", Spec: json.RawMessage(`{"argv":["false"]}`), Recovery: "manual"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Write(ctx, func(tx *store.Tx) error {
		for _, id := range []int64{every, once} {
			if _, err := tx.StartJob(id); err != nil {
				return err
			}
		}
		if err := tx.EndJob(store.JobEnd{ID: every, To: store.JobPending, Result: json.RawMessage(`{"n":1}`), NextDue: time.Now().Add(time.Minute)}); err != nil {
			return err
		}
		return tx.EndJob(store.JobEnd{ID: once, To: store.JobFailed, Error: "exit status 1", Preview: "it broke", OutputBytes: 8})
	}); err != nil {
		t.Fatal(err)
	}
	f.drain(r)
	st, _, _ := f.st.HookState(ctx, "s", "jobs.seen")
	want := fmt.Sprintf(`{"seen":["%d:pending:1:{'n': 1}:","%d:failed:1:None:it broke"]}`, every, once)
	if string(st) != want {
		t.Errorf("state %s, want %s", st, want)
	}
}
