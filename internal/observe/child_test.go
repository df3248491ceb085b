package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/store"
)

// delegated is the daemon's check: agents.Delegated, as for cells.
func delegated(st *store.Store) func(ctx context.Context, session, op string) (any, error) {
	return func(ctx context.Context, session, op string) (any, error) {
		c, err := agents.Delegated(ctx, st, session, op, "an observer bound in a child speaks only as the spawn delegated")
		if c == nil {
			return nil, err
		}
		return c, err
	}
}

// An observer bound in a child agent's session (the child is pinned to
// its parent's release) proposes local.send: refused in a child the spawn
// did not delegate it to, carried out as the child's (on its own speech
// lane, the receipt naming it) in one it did. The children's ends reach
// the parent's observer as child.completed and child.failed.
func TestObserverSpeechInAChildIsDelegationChecked(t *testing.T) {
	f := newFixture(t)
	code := `
def say(inp):
    return {"commands": [{"op": "local.send", "args": {"text": "observer: " + str(inp["event"]["data"].get("text"))}}]}
def ends(inp):
    d = inp["event"]["data"]
    seen = inp["state"].get("seen", [])
    return {"state": {"seen": seen + ["%s:%s:%s:%s" % (inp["event"]["kind"], d["child"], d["state"], d.get("result"))]}}
SLOTS["child.say"] = say
SLOTS["child.ends"] = ends
`
	release := f.release(code, "[[hooks.observers]]\nhandler = \"child.say\"\nevents = [\"input.accepted\"]\n"+
		"[[hooks.observers]]\nhandler = \"child.ends\"\nevents = [\"child.completed\", \"child.failed\"]\n")
	ctx := context.Background()
	var mute, loud store.Spawned
	if err := f.st.Write(ctx, func(tx *store.Tx) (err error) {
		if mute, err = tx.SpawnChild(store.NewChild{Parent: "s", Release: release, Task: "stay quiet"}); err != nil {
			return err
		}
		loud, err = tx.SpawnChild(store.NewChild{Parent: "s", Release: release, Task: "speak", Delegate: []string{"local.send"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r := New(Config{Store: f.st, Hooks: f.hk, Delegated: delegated(f.st)})
	drainAll := func() {
		for range 100 {
			busy := false
			for _, s := range []string{"s", mute.Session, loud.Session} {
				if _, err := r.Pass(ctx, s); err != nil {
					t.Fatal(err)
				}
				open, _ := f.st.OpenObserverCommands(ctx, s, 1)
				busy = busy || len(open) > 0
			}
			stats, _ := f.st.ObserverStats(ctx)
			for _, s := range stats {
				busy = busy || s.Backlog > 0 && s.Paused == ""
			}
			if !busy {
				return
			}
		}
	}
	drainAll()
	now := time.Now()
	if err := f.st.Write(ctx, func(tx *store.Tx) error {
		for _, s := range []string{mute.Session, loud.Session} {
			if _, err := tx.AdmitInput(store.NewInput{Session: s, SourceKind: "operator", SourceKey: "k-" + s, Conversation: "operator",
				Author: "operator", Directed: true, OccurredAt: now, ReceivedAt: now, Body: "hello " + s}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	drainAll()
	speech := func(session string) []store.Record {
		recs, err := f.st.Records(ctx, session, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var out []store.Record
		for _, r := range recs {
			if r.Lane == store.LaneSpeech {
				out = append(out, r)
			}
		}
		return out
	}
	// The undelegated child: each of its inputs' commands refused, nothing said.
	if sp := speech(mute.Session); len(sp) != 0 {
		t.Fatalf("the undelegated child's observer spoke: %s", sp[0].Content)
	}
	cmds, _ := f.st.ObserverCommands(ctx, mute.Session)
	if len(cmds) == 0 {
		t.Fatal("the undelegated child's observer proposed nothing")
	}
	for _, c := range cmds {
		if c.State != "refused" || !strings.Contains(string(c.Result), "did not delegate local.send") {
			t.Fatalf("the undelegated child's command: %s %s", c.State, c.Result)
		}
	}
	// The delegated child: said on its own lane, the record naming it.
	sp := speech(loud.Session)
	if len(sp) == 0 {
		t.Fatal("the delegated child's observer did not speak")
	}
	var rec struct {
		Child agents.ChildRef `json:"child"`
	}
	if err := json.Unmarshal(sp[len(sp)-1].Content, &rec); err != nil || rec.Child.Session != loud.Session || rec.Child.Parent != "s" || rec.Child.Job != loud.Job {
		t.Fatalf("the delegated send's record: %s", sp[len(sp)-1].Content)
	}
	for _, r := range speech("s") {
		if strings.Contains(string(r.Content), "observer: ") {
			t.Fatalf("a child's observer spoke on the parent's lane: %s", r.Content)
		}
	}
	// The children end: the parent's observer tells result from failure.
	if err := f.st.Write(ctx, func(tx *store.Tx) error {
		if _, err := tx.EndChild(loud.Session, store.JobSucceeded, json.RawMessage(`7`), "", "n1"); err != nil {
			return err
		}
		_, err := tx.EndChild(mute.Session, store.JobFailed, nil, "it broke", "n2")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	drainAll()
	st, _, _ := f.st.HookState(ctx, "s", "child.ends")
	want := fmt.Sprintf(`{"seen":["child.completed:%s:succeeded:7","child.failed:%s:failed:None"]}`, loud.Session, mute.Session)
	if string(st) != want {
		t.Errorf("the parent's observer state %s, want %s", st, want)
	}
}
