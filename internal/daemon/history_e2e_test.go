package daemon

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// validSequence checks that every tool call of a request is answered, by
// the messages right after it, under its id, and nothing else is a tool
// message.
func validSequence(req modeltest.Request) error {
	msgs := req.Messages
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		if m["role"] == "tool" {
			return fmt.Errorf("message %d: a tool message no call asked for", i)
		}
		calls, _ := m["tool_calls"].([]any)
		for _, c := range calls {
			i++
			id := c.(map[string]any)["id"]
			if i >= len(msgs) || msgs[i]["role"] != "tool" || msgs[i]["tool_call_id"] != id {
				return fmt.Errorf("call %v is not answered right after its message", id)
			}
		}
	}
	return nil
}

// A 500-step session under a small budget runs to its end without a
// context pause: the context is compacted between steps (summaries of
// summaries as it goes on), every request stays under the budget and is a
// valid sequence, the summarizer is asked once per compaction, and the
// originals stay searchable and readable exactly.
func TestLongSessionUnderSmallBudget(t *testing.T) {
	const steps, budget = 500, 6000
	model := modeltest.New()
	defer model.Close()
	var step atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := step.Add(1)
		if n > steps {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d: keep counting", n),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('marker%d', 'x' * 300)", n)}}}
	})
	var summaries atomic.Int32
	model.ToolFree(func(req modeltest.Request) modeltest.Reply {
		summaries.Add(1)
		return modeltest.Reply{Text: fmt.Sprintf("Summary %d: the agent counted steps and printed markers.", summaries.Load())}
	})
	a := startAgent(t, model, fmt.Sprintf("context_budget_tokens = %d\nmax_steps = %d\n", budget, steps+10))
	a.send("count to five hundred, one cell at a time")
	a.eventually("the session waits", a.state(store.StateWaiting))

	if n := len(a.kinds(store.LaneNotice, "context.budget")); n != 0 {
		t.Fatalf("%d context.budget pauses", n)
	}
	compacted := a.kinds(store.LaneNotice, "context.compacted")
	if len(compacted) == 0 || int(summaries.Load()) != len(compacted) {
		t.Fatalf("%d compactions, %d summarizer requests (want one each, no retries)", len(compacted), summaries.Load())
	}
	deepest := 0.0
	for _, r := range compacted {
		var n map[string]any
		_ = json.Unmarshal(r.Content, &n)
		if n["kind"] != "normal" {
			t.Fatalf("a %v compaction on the happy path: %s", n["kind"], r.Content)
		}
		deepest = max(deepest, n["depth"].(float64))
	}
	if deepest < 2 {
		t.Fatalf("no summary of summaries after %d compactions", len(compacted))
	}
	historyBytes := 0
	for _, r := range a.records() {
		if r.Lane != store.LaneNotice {
			historyBytes += len(r.Content)
		}
	}
	t.Logf("%d summarizer requests for about %d tokens of history: %.1f per 100k tokens; deepest summary %v",
		summaries.Load(), historyBytes/4, float64(summaries.Load())/(float64(historyBytes)/4/100000), deepest)
	reserve := budget / 4
	agentRequests := 0
	for i, req := range model.Requests() {
		if len(req.Tools) == 0 {
			if len(req.Messages) != 2 {
				t.Fatalf("summary request %d: %d messages", i, len(req.Messages))
			}
			continue
		}
		agentRequests++
		if err := validSequence(req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := json.Marshal(req.Body["messages"])
		tb, _ := json.Marshal(req.Body["tools"])
		if est := (len(b)+len(tb))/4 + reserve; est > budget {
			t.Fatalf("request %d needs about %d tokens with its reserve, over the budget %d", i, est, budget)
		}
	}
	if agentRequests != steps+1 {
		t.Fatalf("%d agent requests, want %d", agentRequests, steps+1)
	}
	// The originals: an early marker is found, and read exactly.
	res, err := a.c.SearchHistory(t.Context(), "default", "marker7", history.Scope{Lane: "cell"}, 5)
	if err != nil || len(res.Hits) != 2 || res.Hits[0].Kind != "cell.finished" || res.Hits[1].Kind != "cell.started" {
		t.Fatalf("search (the cell's code and its output): %+v %v", res, err)
	}
	rec, err := a.c.ReadHistory(t.Context(), res.Hits[0].Ref, 100000, 0)
	if err != nil || rec.CoveredBy == "" || !strings.Contains(string(rec.Content), "marker7 "+strings.Repeat("x", 300)) {
		t.Fatalf("read %s: covered by %q, %s, %v", res.Hits[0].Ref, rec.CoveredBy, rec.Content, err)
	}
	if kids, err := a.c.HistoryChildren(t.Context(), rec.CoveredBy); err != nil || len(kids) < 2 {
		t.Fatalf("children of %s: %v %v", rec.CoveredBy, kids, err)
	}
	st := a.session()
	if st.Context == nil || st.Context.ContextState == nil || st.Context.Summaries == 0 || st.Context.Budget != budget ||
		st.Context.Tokens > budget || st.Context.Items < 2*steps {
		t.Fatalf("status context: %+v %+v", st.Context, st.Context.ContextState)
	}
	metrics := a.scrape()
	for _, want := range []string{`klbr_context_budget_tokens{session="default"} 6000`, `klbr_context_compactions_total{kind="normal",session="default"}`,
		`klbr_summarizer_requests_total{outcome="ok",route="main"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Each slot's latency series exists from the start: these were called.
	for _, slot := range []string{"compaction.plan", "summary.prepare"} {
		if n := metricValue(metrics, `klbr_hook_invocation_duration_seconds_count{outcome="ok",slot="`+slot+`"}`); !(n >= 1) {
			t.Errorf("slot %s was called %v times by the metrics", slot, n)
		}
	}
	// The operator's compact runs the same path until only the last unit
	// is left; then it says so instead of summarizing for nothing.
	for i := 0; ; i++ {
		before := summaries.Load()
		out, err := a.c.Compact(t.Context(), "default")
		if err != nil {
			if !strings.Contains(err.Error(), "nothing to compact") || summaries.Load() != before || i == 0 {
				t.Fatalf("compact %d: %v", i, err)
			}
			break
		}
		if out.Kind != "normal" || summaries.Load() != before+1 || i > 10 {
			t.Fatalf("compact %d: %+v", i, out)
		}
	}
	if err := validSequence(model.Requests()[model.Count()-1]); err != nil {
		t.Fatal(err)
	}
}

// klbr-core compact on a session whose context is under its threshold:
// the oldest run becomes a summary now, and the next request carries it.
func TestOperatorCompacts(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var n atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		i := n.Add(1)
		if i%3 == 0 {
			return modeltest.Reply{Text: "waiting", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", i), Code: "await runtime.wait(None)"}}}
		}
		return modeltest.Reply{Text: "working", Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", i), Code: "print('y' * 2000)"}}}
	})
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "The agent printed y twice per input."}
	})
	a := startAgent(t, model, "")
	for i := range 4 {
		a.send(fmt.Sprintf("round %d", i))
		a.eventually("waiting", func() bool { return a.session().State == store.StateWaiting && int(n.Load()) >= 3*(i+1) })
	}
	out, err := a.c.Compact(t.Context(), "default")
	if err != nil || out.Kind != "normal" || out.Summary == "" || out.SummaryTokens >= out.SourceTokens {
		t.Fatalf("compact: %+v %v", out, err)
	}
	// One measure, labelled, the same in the answer and the record tail and
	// the browser show: the context's estimated size before and after.
	notices := a.kinds(store.LaneNotice, "context.compacted")
	if len(notices) != 1 {
		t.Fatalf("%d context.compacted notices, want 1", len(notices))
	}
	var nc struct {
		Before int `json:"tokens_before"`
		After  int `json:"tokens_after"`
	}
	if err := json.Unmarshal(notices[0].Content, &nc); err != nil || nc.After >= nc.Before {
		t.Fatalf("the notice %s: %v", notices[0].Content, err)
	}
	if want := history.Measure(nc.Before, nc.After); !strings.Contains(out.Message, want) || out.TokensBefore != nc.Before || out.TokensAfter != nc.After {
		t.Fatalf("compact answered %+v; want the notice's measure %q", out, want)
	}
	a.send("after the compaction")
	a.eventually("answered", func() bool { return int(n.Load()) >= 15 })
	last := model.Requests()[model.Count()-1]
	if err := validSequence(last); err != nil || !strings.Contains(content(last.Messages[1]), "[klbr summary "+out.Summary) {
		t.Fatalf("the next request: %v %s", err, roles(last))
	}
}

// SIGKILL of klbr-core while a summary is being generated, and around its
// commit, 20 times each: on every restart the coverage invariant holds
// (nothing covered twice, nothing lost), and every request the agent sends
// afterwards is a valid sequence.
func TestCompactionSurvivesSIGKILL(t *testing.T) {
	const rounds = 20
	model := modeltest.New()
	defer model.Close()
	hold := make(chan struct{})
	defer close(hold) // before model.Close: a held summary request returns
	var steps atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := steps.Add(1)
		return modeltest.Reply{Text: "working", Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: "print('z' * 400)"}}}
	})
	var hang atomic.Bool
	summaries := make(chan struct{}, 1000)
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		summaries <- struct{}{}
		if hang.Load() {
			<-hold
		}
		return modeltest.Reply{Text: "The agent printed z."}
	})
	a := startAgent(t, model, "context_budget_tokens = 6000\nmax_steps = 10000\nmax_turn_seconds = 600\n")
	a.send("print until stopped")
	check := func(what string, i int) {
		t.Helper()
		st, err := store.Open(t.Context(), a.data, store.Options{})
		if err != nil {
			t.Fatalf("%s %d: reopen: %v", what, i, err)
		}
		defer st.Close()
		s, err := st.Session(t.Context(), "default")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CheckCoverage(t.Context(), "default", s.ContextEpoch); err != nil {
			t.Fatalf("%s %d: %v", what, i, err)
		}
	}
	wait := func() {
		t.Helper()
		select {
		case <-summaries:
		case <-time.After(60 * time.Second):
			t.Fatalf("no summary request\n%s", a.d)
		}
	}
	hang.Store(true)
	for i := range rounds {
		wait() // a summary is being generated
		a.kill()
		check("killed while generating", i)
		a.start()
	}
	hang.Store(false)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range rounds {
		wait()
		time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond) // the answer arrives, is validated, commits
		a.kill()
		check("killed around the commit", i)
		a.start()
	}
	before := steps.Load()
	a.eventually("the agent goes on", func() bool { return steps.Load() > before+20 })
	// On a loaded machine fewer kills land after a commit; the agent goes on
	// compacting meanwhile, and half the rounds' worth must have committed.
	a.eventually("compactions commit", func() bool { return len(a.kinds(store.LaneNotice, "context.compacted")) >= rounds/2 })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	for i, req := range model.Requests() {
		if len(req.Tools) == 0 {
			continue
		}
		if err := validSequence(req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}

// Output past the preview bound is spooled to an artifact; history.read
// opens it by ref, bounded, and continues it at an offset — from the CLI's
// client and from a cell.
func TestArtifactsReadThroughHistory(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "big", Code: "print(' '.join('row%d' % i for i in range(25000)))"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "look", Code: "import json\n" +
			"hit = [h for h in await history.search('row7', scope={'lane': 'cell'}) if h.kind == 'cell.finished'][0]\n" +
			"rec = await history.read(hit.ref, max_bytes=300000)\n" +
			"art = json.loads(json.dumps(rec.content))['output']['artifact']['sha256']\n" +
			"part = await history.read('a' + art, max_bytes=1000, offset=5)\n" +
			"print(len(part.text), part.truncated, part.offset, part.text[:10])"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("make a lot of output")
	a.eventually("waiting", a.state(store.StateWaiting))
	var sha string
	for _, r := range a.kinds(store.LaneCell, "cell.finished") {
		var o struct {
			Output struct {
				Artifact *struct {
					SHA256 string `json:"sha256"`
				} `json:"artifact"`
			} `json:"output"`
			Stdout string
		}
		if json.Unmarshal(r.Content, &o) == nil && o.Output.Artifact != nil {
			sha = o.Output.Artifact.SHA256
		}
		if strings.Contains(string(r.Content), "1000 True 1005 row1 row2") {
			sha += "+cell"
		}
	}
	if !strings.HasSuffix(sha, "+cell") {
		t.Fatalf("no artifact, or the cell's read of it failed:\n%s", a.dump())
	}
	sha = strings.TrimSuffix(sha, "+cell")
	rec, err := a.c.ReadHistory(t.Context(), "a"+sha, 150000, 0)
	if err != nil || !rec.Truncated || len(rec.Text) != 150000 || rec.Offset != 150000 || rec.Producer == "" {
		t.Fatalf("read: truncated %v, %d bytes, offset %d, producer %q, %v", rec.Truncated, len(rec.Text), rec.Offset, rec.Producer, err)
	}
	rest, err := a.c.ReadHistory(t.Context(), "a"+sha, 150000, rec.Offset)
	if err != nil || rest.Truncated || int64(len(rec.Text)+len(rest.Text)) != rec.Size || rec.Size < 200000 {
		t.Fatalf("the rest: %d bytes, truncated %v, %v", len(rest.Text), rest.Truncated, err)
	}
}
