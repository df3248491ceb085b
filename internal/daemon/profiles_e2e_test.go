package daemon

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// reviewerProfile is the test's profile: its own route, "side".
const reviewerProfile = `description = "reviews on the side route"
instructions = "PROFILE-INSTRUCTIONS: report problems only."
route = "side"
[budget]
model_requests = 10
`

// startProfileAgent runs the daemon with two routes: the agent's "main"
// on model, and "side" on side; the behavior tree has profiles/reviewer.toml.
func startProfileAgent(t *testing.T, model, side *modeltest.Server) *agent {
	t.Helper()
	routes := fmt.Sprintf("[routes.side]\nurl = %q\nmodel = \"fake-side\"\ntimeout_seconds = 30\n", side.URL())
	return startAgentWithTree(t, model, routes, map[string]string{
		"profiles/reviewer.toml": reviewerProfile,
		"profiles/faraway.toml":  "description = \"far\"\nroute = \"nowhere\"\n",
	})
}

// The root (route main, on one model server) spawns a child with a profile
// whose route is side (on another): every request of the child goes to the
// side server and carries the profile's instructions, every request of the
// root goes to the main server, the records name the route each went
// along, and the child's result reaches the root once.
func TestChildProfileRouteGoesToItsOwnServer(t *testing.T) {
	model, side := modeltest.New(), modeltest.New()
	defer model.Close()
	defer side.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "print('PROFILES', [p['name'] for p in await agents.profiles()])\n" +
			"try:\n    await agents.spawn(task='x', profile='nosuch')\nexcept Exception as e:\n    print('NOSUCH', e)\n" +
			"try:\n    await agents.spawn(task='x', profile='faraway')\nexcept Exception as e:\n    print('FARAWAY', e)\n" +
			"child = await agents.spawn(task='review the change', profile='reviewer')\n" +
			"print('SPAWNED', child.id, child['spec']['profile'], child['spec']['route'], child['budget'])\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Text: "The review is in.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	side.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "me = await agents.current()\nprint('ME', me['spec']['route'])"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish({'problems': 0})"}}},
	)
	a := startProfileAgent(t, model, side)
	a.send("review through a child")
	a.eventually("the root was woken", func() bool { return model.Count() == 2 })
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if model.Count() != 2 || side.Count() != 2 {
		t.Fatalf("main server %d requests, side server %d; want 2 and 2; the root saw %q", model.Count(), side.Count(), lastMessage(model.Requests()[model.Count()-1]))
	}
	for i, req := range side.Requests() {
		var saw bool
		for _, m := range req.Messages {
			saw = saw || strings.Contains(content(m), "PROFILE-INSTRUCTIONS: report problems only.")
			if strings.Contains(content(m), "review through a child") {
				t.Fatalf("side request %d carries the root's input", i)
			}
		}
		if !saw {
			t.Fatalf("side request %d lacks the profile's instructions", i)
		}
		if req.Body["model"] != "fake-side" {
			t.Fatalf("side request %d asked for model %v", i, req.Body["model"])
		}
	}
	for i, req := range model.Requests() {
		for _, m := range req.Messages {
			if strings.Contains(content(m), "You are child agent") {
				t.Fatalf("main request %d is the child's", i)
			}
		}
	}
	if got := lastMessage(side.Requests()[1]); !strings.Contains(got, "ME side") {
		t.Fatalf("the child's cell: %q", got)
	}
	reqs := model.Requests()
	if woke := lastUser(reqs[1]); !strings.HasPrefix(woke, "[klbr] child 1 succeeded") || !strings.Contains(woke, `{"problems":0}`) {
		t.Fatalf("the root woke to %q", woke)
	}
	root := a.records()
	var printed string
	for _, r := range root {
		if r.Lane == store.LaneCell {
			printed += string(r.Content)
		}
	}
	if !strings.Contains(printed, "PROFILES") || !strings.Contains(printed, "reviewer") || !strings.Contains(printed, "code-review") {
		t.Fatalf("agents.profiles: %s", printed)
	}
	if !strings.Contains(printed, `route \"nowhere\" is not configured`) {
		t.Fatalf("the spawn with an unconfigured route printed %s", printed)
	}
	if !strings.Contains(printed, `no such profile \"nosuch\" in the release (it has code-review, faraway, reviewer)`) || !strings.Contains(printed, "SPAWNED 1 reviewer side {'model_requests': 10}") {
		t.Fatalf("the root's spawns printed %s", printed)
	}
	routes := func(recs []store.Record) map[string]int {
		n := map[string]int{}
		for _, r := range recs {
			if r.Lane == store.LaneScratchpad {
				var c struct{ Route string }
				json.Unmarshal(r.Content, &c)
				n[c.Route]++
			}
		}
		return n
	}
	if got := routes(a.sessionRecords("child-1")); got["side"] != 2 || len(got) != 1 {
		t.Fatalf("the child's steps went along %v, want side only", got)
	}
	if got := routes(root); got["main"] != 2 || len(got) != 1 {
		t.Fatalf("the root's steps went along %v, want main only", got)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("child notifications %q, want one", in)
	}
	metrics := a.scrape()
	for _, want := range []string{`klbr_model_requests_total{outcome="ok",route="main"} 2`, `klbr_model_requests_total{outcome="ok",route="side"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
