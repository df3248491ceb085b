package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// agent is a klbr-core child whose route is a scripted fake model.
type agent struct {
	t     *testing.T
	model *modeltest.Server
	data  string
	env   []string
	d     *child
	c     *localclient.Client
	keys  int
}

// startAgent starts klbr-core with its agent route at model; toml adds to [agent].
func startAgent(t *testing.T, model *modeltest.Server, toml string) *agent {
	t.Helper()
	return startAgentWith(t, model, toml, "")
}

// startAgentWith is startAgent with klbr-kernel found in kernel ("": the test build's).
func startAgentWith(t *testing.T, model *modeltest.Server, toml, kernel string) *agent {
	t.Helper()
	requirePython(t)
	data, env := instance(t)
	return startAgentAt(t, model, toml, kernel, data, env)
}

// startAgentAt is startAgentWith on an initialized data directory.
func startAgentAt(t *testing.T, model *modeltest.Server, toml, kernel, data string, env []string) *agent {
	t.Helper()
	if kernel == "" {
		kernel = kernelDir(t)
	}
	conf := filepath.Join(data, "klbr.toml")
	body := fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n%s\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 30\n", toml, model.URL())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+kernel+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)
	a := &agent{t: t, model: model, data: data, env: env}
	a.start()
	return a
}

func (a *agent) start() {
	a.t.Helper()
	a.d = startChildWithoutCgroups(a.t, nil, a.env...)
	a.c = localclient.New(filepath.Join(a.data, "control.sock"))
	a.t.Cleanup(a.c.Close)
	a.eventually("the daemon answers", func() bool { _, err := a.c.Status(a.t.Context()); return err == nil })
}

// kill SIGKILLs the daemon.
func (a *agent) kill() {
	a.t.Helper()
	a.d.cmd.Process.Signal(syscall.SIGKILL)
	a.d.wait(a.t)
}

func (a *agent) send(text string) {
	a.t.Helper()
	a.keys++
	if _, err := a.c.Send(a.t.Context(), "default", api.SendRequest{Text: text, SourceKey: fmt.Sprintf("test-%d-%d", time.Now().UnixNano(), a.keys)}); err != nil {
		a.t.Fatal(err)
	}
}

func (a *agent) records() []store.Record {
	a.t.Helper()
	var out []store.Record
	var since int64
	for {
		page, err := a.c.Records(a.t.Context(), "default", since, 1000)
		if err != nil {
			a.t.Fatal(err)
		}
		out = append(out, page.Records...)
		if !page.More || len(page.Records) == 0 {
			return out
		}
		since = page.Records[len(page.Records)-1].Seq
	}
}

func (a *agent) kinds(lane store.Lane, kind string) []store.Record {
	var out []store.Record
	for _, r := range a.records() {
		if r.Lane == lane && (kind == "" || r.Kind == kind) {
			out = append(out, r)
		}
	}
	return out
}

func (a *agent) session() api.SessionStatus {
	a.t.Helper()
	s, err := a.c.Session(a.t.Context(), "default")
	if err != nil {
		a.t.Fatal(err)
	}
	return s
}

func (a *agent) eventually(what string, cond func() bool) {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			a.t.Fatalf("timed out waiting: %s\nrecords:\n%s\ndaemon log:\n%s", what, a.dump(), a.d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (a *agent) dump() string {
	var b strings.Builder
	page, err := a.c.Records(a.t.Context(), "default", 0, 1000)
	if err != nil {
		return err.Error()
	}
	for _, r := range page.Records {
		fmt.Fprintf(&b, "%d %s %s %s\n", r.Seq, r.Lane, r.Kind, r.Content)
	}
	return b.String()
}

func (a *agent) state(want store.SessionState) func() bool {
	return func() bool { return a.session().State == want }
}

// roles renders a request's messages as role[:tool-call-ids] for comparison.
func roles(req modeltest.Request) string {
	var parts []string
	for _, m := range req.Messages {
		p, _ := m["role"].(string)
		if calls, ok := m["tool_calls"].([]any); ok {
			var ids []string
			for _, c := range calls {
				ids = append(ids, c.(map[string]any)["id"].(string))
			}
			p += "(" + strings.Join(ids, ",") + ")"
		}
		if id, ok := m["tool_call_id"].(string); ok {
			p += "<" + id + ">"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// scrape reads the daemon's /metrics.
func (a *agent) scrape() string {
	a.t.Helper()
	_, after, ok := strings.Cut(a.d.String(), "READY http=")
	if !ok {
		a.t.Fatal("no READY line")
	}
	addr, _, _ := strings.Cut(after, " ")
	_, body := get(a.t, http.DefaultClient, "http://"+addr+"/metrics")
	return body
}

func content(m map[string]any) string { s, _ := m["content"].(string); return s }

// "Think, speak, and wait": scratchpad, two cells, one local.send, then a
// 60-second wait: one delivered message, each record in its lane, and no
// model request while it waits until input arrives.
func TestThinkSpeakAndWait(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Text: "The operator wants the answer. Let me compute it first.", Reasoning: "six sevens",
			Calls: []modeltest.Call{{ID: "c1", Code: "x = 6 * 7\nx"}},
			Usage: map[string]any{"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": map[string]any{"cached_tokens": 100}}},
		modeltest.Reply{Text: "Now I tell them, then wait.", Calls: []modeltest.Call{{ID: "c2",
			Code: "r = await local.send(f'The answer is {x}.')\nprint(r['status'])\nawait runtime.wait(60, reason='the operator may follow up')\nprint('after the wait')"}}},
		modeltest.Reply{Text: "They said thanks; I am done.", Calls: []modeltest.Call{{ID: "c3", Code: "await runtime.wait(None, reason='nothing to do')"}}},
	)
	a := startAgent(t, model, "")
	a.send("what is six times seven?")
	a.eventually("the session waits", a.state(store.StateWaiting))

	speech := a.kinds(store.LaneSpeech, "")
	if len(speech) != 1 || speech[0].Kind != "local.sent" || !strings.Contains(string(speech[0].Content), "The answer is 42.") {
		t.Fatalf("speech lane: %+v", speech)
	}
	pads := a.kinds(store.LaneScratchpad, "scratchpad")
	if len(pads) != 2 || !strings.Contains(string(pads[0].Content), "Let me compute it first") {
		t.Fatalf("scratchpad lane: %d records\n%s", len(pads), a.dump())
	}
	var pad struct {
		Text      string `json:"text"`
		Reasoning string `json:"reasoning"`
		Usage     map[string]int
	}
	json.Unmarshal(pads[0].Content, &pad)
	if pad.Reasoning != "six sevens" || strings.Contains(pad.Text, "six sevens") ||
		pad.Usage["prompt"] != 120 || pad.Usage["cache_read"] != 100 || len(pad.Usage) != 3 {
		t.Fatalf("reasoning and usage are kept apart, as reported (cache writes absent): %s", pads[0].Content)
	}
	if started, finished := a.kinds(store.LaneCell, "cell.started"), a.kinds(store.LaneCell, "cell.finished"); len(started) != 2 || len(finished) != 2 {
		t.Fatalf("cells: %d started, %d finished", len(started), len(finished))
	}
	last := a.kinds(store.LaneCell, "cell.finished")[1]
	var out struct {
		Status string `json:"status"`
		Output struct {
			Preview []struct{ Data string } `json:"preview"`
		} `json:"output"`
	}
	json.Unmarshal(last.Content, &out)
	if out.Status != "yielded" || len(out.Output.Preview) != 1 || out.Output.Preview[0].Data != "confirmed\n" {
		t.Fatalf("the waiting cell: %s", last.Content)
	}
	s := a.session()
	if s.Wait == nil || s.Wait.Deadline == nil || time.Until(*s.Wait.Deadline) < 50*time.Second || s.Wait.Reason != "the operator may follow up" {
		t.Fatalf("wait: %+v", s.Wait)
	}
	// Waiting costs no inference.
	time.Sleep(500 * time.Millisecond)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests while waiting, want 2", n)
	}

	a.send("thanks!")
	a.eventually("the third request", func() bool { return model.Count() == 3 })
	a.eventually("waiting again", func() bool {
		s := a.session()
		return s.State == store.StateWaiting && s.Wait != nil && s.Wait.Deadline == nil
	})
	reqs := model.Requests()
	if got, want := roles(reqs[2]), "system user assistant(c1) tool<c1> assistant(c2) tool<c2> user user"; got != want {
		t.Fatalf("third request's messages:\n got %s\nwant %s", got, want)
	}
	m := reqs[2].Messages
	if !strings.Contains(content(m[3]), "value: 42") || !strings.Contains(content(m[5]), "status: yielded") ||
		!strings.Contains(content(m[6]), "You woke: input") || content(m[7]) != "thanks!" {
		t.Fatalf("third request's contents: %v", m)
	}
	for _, r := range a.kinds(store.LaneCell, "cell.finished") {
		if strings.Contains(string(r.Content), "after the wait") {
			t.Fatal("code after runtime.wait ran")
		}
	}
	if !strings.Contains(content(m[0]), "Speech is explicit") {
		t.Fatalf("the system prompt is not the release's instructions: %.200s", content(m[0]))
	}
	if tools := reqs[0].Tools; len(tools) != 1 || !strings.Contains(fmt.Sprint(tools[0]), "python") {
		t.Fatalf("tools: %v", tools)
	}
	if strings.Contains(fmt.Sprint(m[2]), "six sevens") {
		t.Fatalf("reasoning was sent back as content: %v", m[2])
	}
	metrics := a.scrape()
	for _, want := range []string{`klbr_model_requests_total{outcome="ok",route="main"} 3`,
		`klbr_model_tokens_total{kind="cache_read",route="main"} 100`, `klbr_model_tokens_total{kind="prompt",route="main"} 120`,
		`klbr_session_state{session="default",state="waiting"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, `kind="cache_write"`) {
		t.Error("cache writes were never reported, yet /metrics counts them")
	}
}

// A model that only writes prose delivers nothing: one reminder, then idle.
func TestProseDeliversNothing(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Text: "Hello! I would greet the operator here."}, modeltest.Reply{Text: "Still just thinking."})
	a := startAgent(t, model, "")
	a.send("hi")
	a.eventually("idle", func() bool {
		s := a.session()
		return s.State == store.StateReady && s.Attempt != nil && s.Attempt.State == store.AttemptIdle
	})
	if sp := a.kinds(store.LaneSpeech, ""); len(sp) != 0 {
		t.Fatalf("prose was delivered: %+v", sp)
	}
	if r := a.kinds(store.LaneNotice, "delivery.reminder"); len(r) != 1 {
		t.Fatalf("%d reminders, want 1", len(r))
	}
	time.Sleep(300 * time.Millisecond)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests, want 2 (no idle inference)", n)
	}
	if !strings.Contains(content(model.Requests()[1].Messages[3]), "nothing has been delivered") {
		t.Fatalf("the reminder: %v", model.Requests()[1].Messages)
	}
}

// Killing the daemon mid-cell: after a restart the tool call is answered
// as interrupted under its id, the next request is a valid sequence, and
// the input and the receipt recorded before the kill remain.
func TestKilledMidCell(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "s1", Code: "await local.send('starting a long job')"}}},
		modeltest.Reply{Text: "long job", Calls: []modeltest.Call{{ID: "k1", Code: "import time\ntime.sleep(120)"}, {ID: "k2", Code: "print('second')"}}},
		modeltest.Reply{Text: "I was interrupted; waiting.", Calls: []modeltest.Call{{ID: "w1", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("run the long job")
	a.eventually("the long cell runs", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.started") {
			if strings.Contains(string(r.Content), "time.sleep(120)") {
				return true
			}
		}
		return false
	})
	a.kill()
	a.start()
	a.eventually("the resumed attempt waits", a.state(store.StateWaiting))
	reqs := model.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests", len(reqs))
	}
	if got, want := roles(reqs[2]), "system user assistant(s1) tool<s1> assistant(k1,k2) tool<k1> tool<k2> user"; got != want {
		t.Fatalf("request after the restart:\n got %s\nwant %s", got, want)
	}
	m := reqs[2].Messages
	if !strings.Contains(content(m[5]), "status: lost") || !strings.Contains(content(m[6]), "status: interrupted") ||
		!strings.Contains(content(m[7]), "restarted") {
		t.Fatalf("interrupted results: %v", m[5:])
	}
	if in := a.kinds(store.LaneInput, ""); len(in) != 1 {
		t.Fatalf("inputs: %+v", in)
	}
	if sp := a.kinds(store.LaneSpeech, "local.sent"); len(sp) != 1 {
		t.Fatalf("receipts: %+v", sp)
	}
}

// Operator input during a long cell preempts it: the cell ends cancelled,
// and the next request carries the new input.
func TestOperatorPreemptsLongCell(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "l1", Code: "import asyncio\nawait asyncio.sleep(120)"}}},
		modeltest.Reply{Text: "The operator interrupted me.", Calls: []modeltest.Call{{ID: "w1", Code: "await local.send('stopped')\nawait runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("sleep for a while")
	a.eventually("the long cell runs", func() bool { return len(a.kinds(store.LaneCell, "cell.started")) == 1 })
	start := time.Now()
	a.send("stop that")
	a.eventually("waiting", a.state(store.StateWaiting))
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("preemption took %s", d)
	}
	fin := a.kinds(store.LaneCell, "cell.finished")
	if len(fin) != 2 || !strings.Contains(string(fin[0].Content), `"status":"cancelled"`) {
		t.Fatalf("cells: %+v", fin)
	}
	reqs := model.Requests()
	if got, want := roles(reqs[1]), "system user assistant(l1) tool<l1> user"; got != want {
		t.Fatalf("request after preemption:\n got %s\nwant %s", got, want)
	}
	if content(reqs[1].Messages[4]) != "stop that" {
		t.Fatalf("the new input: %v", reqs[1].Messages[4])
	}
}

// A model endpoint that fails transiently or answers garbage: the input
// stays, each failure is a notice, transient failures are retried as new
// attempts for as long as it takes (more than max_consecutive_errors in a
// row never pauses), and an invalid tool call is answered and the loop goes on.
func TestModelFailures(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Status: 500, Body: `{"error":{"message":"overloaded"}}`},
		modeltest.Reply{Drop: true},
		modeltest.Reply{Text: "calling", Calls: []modeltest.Call{{ID: "t1", Code: "print(1)"}}, Truncate: true},
		modeltest.Reply{Status: 503, Body: `{"error":{"message":"restarting"}}`},
		// A tool call with invalid arguments is answered as invalid and the loop goes on.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "bad", RawArguments: `{"code": 12`}, {ID: "nope", Name: "shell", RawArguments: `{}`}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "ok", Code: "await local.send('recovered')\nawait runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "max_consecutive_errors = 3\n")
	a.send("hello?")
	a.eventually("recovered and waiting", a.state(store.StateWaiting))
	for _, n := range a.kinds(store.LaneNotice, "") {
		if n.Kind == "session.paused" {
			t.Fatalf("a transient failure paused the session: %s", n.Content)
		}
	}
	errs := a.kinds(store.LaneNotice, "model.error")
	if len(errs) != 4 {
		t.Fatalf("%d model.error notices, want 4", len(errs))
	}
	for _, e := range errs {
		var n map[string]any
		if err := json.Unmarshal(e.Content, &n); err != nil {
			t.Fatal(err)
		}
		if n["transient"] != true || n["url"] != model.URL() || n["retry_in_ms"] == nil {
			t.Fatalf("a model.error notice names the URL, that it is transient and when it retries: %s", e.Content)
		}
	}
	for _, p := range a.kinds(store.LaneScratchpad, "scratchpad") {
		if strings.Contains(string(p.Content), `"partial":true`) && strings.Contains(string(p.Content), `"id":"t1"`) {
			t.Fatalf("a cut-off response is recorded as partial, without its incomplete call: %s", p.Content)
		}
	}
	if in := a.kinds(store.LaneInput, ""); len(in) != 1 {
		t.Fatalf("the input: %+v", in)
	}
	if s := a.session(); s.Retry != nil {
		t.Fatalf("a session that recovered still shows a retry: %+v", s.Retry)
	}
	unrun := a.kinds(store.LaneCell, "tool.unrun")
	if len(unrun) != 2 || !strings.Contains(string(unrun[0].Content), `"state":"invalid"`) || !strings.Contains(string(unrun[1].Content), "there is no tool") {
		t.Fatalf("invalid calls: %+v", unrun)
	}
	if sp := a.kinds(store.LaneSpeech, "local.sent"); len(sp) != 1 {
		t.Fatalf("speech: %+v", sp)
	}
	// The request after the invalid calls answered both under their ids.
	if got := roles(model.Requests()[5]); !strings.HasSuffix(got, "assistant(bad,nope) tool<bad> tool<nope>") {
		t.Fatalf("after invalid calls: %s", got)
	}
}

// A route that is down (its connections dropped, then 503 and 429 with
// Retry-After) is retried with capped backoff for as long as it takes;
// status shows the retry, when it is next and the last error with its URL;
// when the route comes back the pending input is answered without anyone
// touching klbr.
func TestRouteOutageIsRetried(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var mu sync.Mutex
	down := true
	var retryAfterAt, afterRetryAt time.Time
	model.Otherwise(func(n int) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !retryAfterAt.IsZero() && afterRetryAt.IsZero():
			afterRetryAt = time.Now()
		case !down:
			return modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('back')\nawait runtime.wait(None)"}}}
		case n == 6:
			retryAfterAt = time.Now()
			return modeltest.Reply{Status: 429, Header: map[string]string{"Retry-After": "1"}, Body: `{"error":{"message":"slow down"}}`}
		case n%2 == 0:
			return modeltest.Reply{Status: 503, Body: `{"error":{"message":"loading model"}}`}
		}
		if !afterRetryAt.IsZero() {
			return modeltest.Reply{Status: 502}
		}
		return modeltest.Reply{Drop: true}
	})
	a := startAgent(t, model, "max_consecutive_errors = 2\nmax_retry_backoff_ms = 1000\n")
	a.send("are you there?")
	a.eventually("the retries outlast max_consecutive_errors", func() bool { return model.Count() >= 8 })
	s := a.session()
	if s.State == store.StatePaused || s.Retry == nil || s.Retry.State != "retrying" || s.Retry.URL != model.URL() ||
		s.Retry.NextAt.IsZero() || s.Retry.InARow < 2 || s.Retry.LastError == "" {
		t.Fatalf("while the route is down: state %s, retry %+v", s.State, s.Retry)
	}
	mu.Lock()
	gap := afterRetryAt.Sub(retryAfterAt)
	down = false
	mu.Unlock()
	if gap < 900*time.Millisecond {
		t.Fatalf("the retry after a 429 with Retry-After: 1 came after %s", gap)
	}
	a.eventually("answered once the route is back", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
	a.eventually("waiting", a.state(store.StateWaiting))
	if s := a.session(); s.Retry != nil {
		t.Fatalf("retry after recovery: %+v", s.Retry)
	}
	for _, n := range a.kinds(store.LaneNotice, "") {
		if n.Kind == "session.paused" {
			t.Fatalf("an outage paused the session: %s", n.Content)
		}
	}
	if !strings.Contains(a.scrape(), `klbr_agent_running 1`) {
		t.Fatal("klbr_agent_running is not 1")
	}
}

// A route that rejects the request (400): a visible notice naming the
// error and the likely fix, the session back to ready, no loop; a new
// operator input makes exactly one new attempt; fixing the route and
// restarting answers the waiting input with no new input.
func TestRejectedRequest(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var mu sync.Mutex
	fixed := false
	model.Otherwise(func(int) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		if fixed {
			return modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('finally')\nawait runtime.wait(None)"}}}
		}
		return modeltest.Reply{Status: 400, Body: `{"error":{"message":"model 'fake' does not exist"}}`}
	})
	a := startAgent(t, model, "")
	a.send("hello")
	a.eventually("the attempt ended with a notice", func() bool { return len(a.kinds(store.LaneNotice, "model.error")) == 1 })
	a.eventually("ready", a.state(store.StateReady))
	e := a.kinds(store.LaneNotice, "model.error")[0]
	if !strings.Contains(string(e.Content), `"transient":false`) || !strings.Contains(string(e.Content), "HTTP 400") ||
		!strings.Contains(string(e.Content), "routes.main.model") {
		t.Fatalf("the notice names the error and the fix: %s", e.Content)
	}
	s := a.session()
	if s.Retry == nil || s.Retry.State != "backing_off" || !strings.Contains(s.Retry.Fix, "routes.main") {
		t.Fatalf("status after a rejection: %+v", s.Retry)
	}
	time.Sleep(300 * time.Millisecond) // many backoffs of 50 ms: a loop would show
	if n := model.Count(); n != 1 {
		t.Fatalf("%d requests after one rejection", n)
	}
	a.send("and now?")
	a.eventually("one new attempt", func() bool { return model.Count() == 2 })
	a.eventually("ready again", a.state(store.StateReady))
	time.Sleep(300 * time.Millisecond)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d requests after the second input, want 2", n)
	}
	mu.Lock()
	fixed = true
	mu.Unlock()
	a.d.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.d.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, a.d)
	}
	a.start()
	a.eventually("answered after the restart", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
	if got := model.Requests()[2].Messages; !strings.Contains(fmt.Sprint(got), "hello") || !strings.Contains(fmt.Sprint(got), "and now?") {
		t.Fatalf("the retry carries the waiting inputs: %v", got)
	}
}

// An input admitted while the wait commits is not stranded: whichever side
// of the commit it lands on, it starts the next step.
func TestInputDuringWaitCommit(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	const rounds = 5
	for range rounds {
		model.Then(modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None, reason='next')"}}})
	}
	a := startAgent(t, model, "")
	for i := range rounds {
		a.send(fmt.Sprintf("input %d", i))
		// The next input races the wait of this one.
		time.Sleep(time.Duration(i) * 3 * time.Millisecond)
	}
	a.eventually("every input was taken in and the session waits", func() bool {
		s := a.session()
		return s.State == store.StateWaiting && s.Pending == 0
	})
	var inputs int
	for _, r := range model.Requests() {
		for _, m := range r.Messages {
			if strings.HasPrefix(content(m), "input ") {
				inputs++
			}
		}
	}
	if last := model.Requests()[model.Count()-1]; !strings.Contains(fmt.Sprint(last.Messages), fmt.Sprintf("input %d", rounds-1)) {
		t.Fatalf("the last input never reached the model: %v (inputs seen %d)", last.Messages, inputs)
	}
}

// A wait's deadline fires once, also across a restart: the deadline is
// persisted, and the woken step says why it woke.
func TestWaitDeadlineSurvivesRestart(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w1", Code: "await runtime.wait(2, reason='check the build')"}}},
		modeltest.Reply{Text: "Woke up.", Calls: []modeltest.Call{{ID: "w2", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("wait two seconds")
	a.eventually("waiting", a.state(store.StateWaiting))
	a.d.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.d.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, a.d)
	}
	if model.Count() != 1 {
		t.Fatalf("%d requests before the deadline", model.Count())
	}
	a.start()
	a.eventually("the deadline fired and the session waits again", func() bool {
		s := a.session()
		return model.Count() == 2 && s.State == store.StateWaiting && s.Wait != nil && s.Wait.Deadline == nil
	})
	m := model.Requests()[1].Messages
	if last := content(m[len(m)-1]); !strings.Contains(last, "You woke: deadline") || !strings.Contains(last, "check the build") {
		t.Fatalf("the woken step: %q", last)
	}
	if n := len(a.kinds(store.LaneNotice, "wait.woken")); n != 1 {
		t.Fatalf("%d wait.woken notices, want 1", n)
	}
	time.Sleep(300 * time.Millisecond)
	if model.Count() != 2 {
		t.Fatalf("the deadline fired more than once: %d requests", model.Count())
	}
}

// Loop guards end the attempt visibly and the session returns to ready;
// the next input starts a new attempt that is answered: the step budget,
// and empty completions in a row.
func TestLoopGuardsEndTheAttempt(t *testing.T) {
	for _, tc := range []struct {
		name, toml, reason string
		reply              func(n int) modeltest.Reply
		requests           int
	}{
		{"steps", "max_steps = 3\n", "step budget", func(n int) modeltest.Reply {
			return modeltest.Reply{Calls: []modeltest.Call{{Code: fmt.Sprintf("n = %d", n)}}}
		}, 3},
		{"empty", "max_empty_completions = 2\n", "2 empty completions", func(int) modeltest.Reply { return modeltest.Reply{} }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := modeltest.New()
			defer model.Close()
			var mu sync.Mutex
			answer := false
			model.Otherwise(func(n int) modeltest.Reply {
				mu.Lock()
				defer mu.Unlock()
				if answer {
					return modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('done')\nawait runtime.wait(None)"}}}
				}
				return tc.reply(n)
			})
			a := startAgent(t, model, tc.toml)
			a.send("loop forever")
			a.eventually("the attempt ended", func() bool { return len(a.kinds(store.LaneNotice, "turn.ended")) == 1 })
			a.eventually("ready", a.state(store.StateReady))
			s := a.session()
			if !strings.Contains(s.StateReason, tc.reason) || model.Count() != tc.requests || s.Attempt == nil || s.Attempt.State != store.AttemptIdle {
				t.Fatalf("reason %q after %d requests, attempt %+v", s.StateReason, model.Count(), s.Attempt)
			}
			time.Sleep(300 * time.Millisecond)
			if model.Count() != tc.requests {
				t.Fatalf("%d requests after the guard ended the attempt", model.Count())
			}
			mu.Lock()
			answer = true
			mu.Unlock()
			a.send("a new input")
			a.eventually("answered", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
			// The new attempt's request says why the last one ended.
			if last := model.Requests()[tc.requests].Messages; !strings.Contains(fmt.Sprint(last), tc.reason) {
				t.Fatalf("the next request does not say why the last attempt ended: %v", last)
			}
		})
	}
	t.Run("context", func(t *testing.T) {
		model := modeltest.New()
		defer model.Close()
		a := startAgent(t, model, "context_budget_tokens = 3000\n")
		a.send(strings.Repeat("a long input ", 2000))
		a.eventually("paused", a.state(store.StatePaused))
		if n := len(a.kinds(store.LaneNotice, "context.budget")); n != 1 || model.Count() != 0 {
			t.Fatalf("%d context.budget notices, %d requests", n, model.Count())
		}
		// An honest pause: the sizes named, and nothing was compacted in vain
		// (the one input is the current frame's, never summarized away).
		if r := a.session().StateReason; !strings.Contains(r, "needs about") || !strings.Contains(r, "the budget is 3000") ||
			!strings.Contains(r, "nothing more can be compacted") {
			t.Fatalf("pause reason %q", r)
		}
		if n := len(a.kinds(store.LaneNotice, "context.compacted")); n != 0 {
			t.Fatalf("%d compactions of a context that cannot shrink", n)
		}
		// A reset starts an empty context; start resumes, and the model
		// sees only what came after.
		if _, err := a.c.Reset(t.Context(), "default", "too long", false); err != nil {
			t.Fatal(err)
		}
		model.Then(modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}})
		a.send("short") // admitted while paused: kept for when it runs again
		if _, err := a.c.StartSession(t.Context(), "default"); err != nil {
			t.Fatal(err)
		}
		a.eventually("waiting", a.state(store.StateWaiting))
		if got := roles(model.Requests()[0]); got != "system user" || content(model.Requests()[0].Messages[1]) != "short" {
			t.Fatalf("after the reset: %s %v", got, model.Requests()[0].Messages)
		}
	})
}

// The operator stops a session during a long cell without the model's
// cooperation: the cell is interrupted and recorded, nothing else runs.
func TestOperatorStopsSession(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Calls: []modeltest.Call{{ID: "l1", Code: "import time\ntime.sleep(120)"}, {ID: "l2", Code: "print('never')"}}})
	a := startAgent(t, model, "")
	a.send("work")
	a.eventually("the long cell runs", func() bool { return len(a.kinds(store.LaneCell, "cell.started")) == 1 })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	a.eventually("the cell ended", func() bool { return len(a.kinds(store.LaneCell, "cell.finished")) == 1 })
	a.eventually("the attempt ended", func() bool {
		s := a.session()
		return s.Attempt != nil && s.Attempt.State == store.AttemptInterrupted
	})
	if s := a.session(); s.State != store.StateStopped {
		t.Fatalf("state %s", s.State)
	}
	if u := a.kinds(store.LaneCell, "tool.unrun"); len(u) != 1 || !strings.Contains(string(u[0].Content), "interrupted") {
		t.Fatalf("the second call: %+v", u)
	}
	time.Sleep(200 * time.Millisecond)
	if model.Count() != 1 {
		t.Fatalf("%d requests after the stop", model.Count())
	}
}

// A workbench that cannot run cells (its kernel binary is gone) is not a
// hidden loop of model requests: each attempt backs off, and after
// max_consecutive_errors cells in a row could not run the attempt ends and
// the session is ready for the next input.
func TestCellsThatCannotRun(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	kernel := filepath.Join(dir, "klbr-kernel")
	if err := os.WriteFile(kernel, src, 0o755); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Calls: []modeltest.Call{{Code: "1"}}} })
	a := startAgentWith(t, model, "max_consecutive_errors = 3\n", dir)
	if err := os.Remove(kernel); err != nil {
		t.Fatal(err)
	}
	a.send("run something")
	a.eventually("the attempt ended", func() bool { return len(a.kinds(store.LaneNotice, "turn.ended")) == 1 })
	a.eventually("ready", a.state(store.StateReady))
	if s := a.session(); !strings.Contains(s.StateReason, "3 cells in a row could not run") {
		t.Fatalf("reason: %q", s.StateReason)
	}
	time.Sleep(300 * time.Millisecond)
	if n := model.Count(); n != 3 {
		t.Fatalf("%d model requests, want 3", n)
	}
	for _, u := range a.kinds(store.LaneCell, "tool.unrun") {
		if !strings.Contains(string(u.Content), `"state":"interrupted"`) {
			t.Fatalf("unrun: %s", u.Content)
		}
	}
}

// A model that keeps waking itself with short deadlines is not a hidden
// loop either: after max_steps wakes in a row without input the wait ends
// and the session is ready; the next input starts a new attempt.
func TestSelfWakesEnd(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(0.01, reason='poll')"}}}
	})
	a := startAgent(t, model, "max_steps = 4\n")
	a.send("poll something")
	a.eventually("the wait ended", func() bool { return len(a.kinds(store.LaneNotice, "turn.ended")) == 1 })
	a.eventually("ready", a.state(store.StateReady))
	if s := a.session(); !strings.Contains(s.StateReason, "4 wakes by deadline in a row") || s.Wait != nil {
		t.Fatalf("reason %q, wait %+v", s.StateReason, s.Wait)
	}
	time.Sleep(300 * time.Millisecond)
	if n := model.Count(); n != 5 { // the input's step, then four woken by deadline
		t.Fatalf("%d requests, want 5", n)
	}
	a.send("again")
	a.eventually("a new attempt", func() bool { return model.Count() == 6 })
}

// A stopped session admits input and says it will not be answered until
// start; nothing is asked of the model until then, and start answers it.
func TestStoppedSessionKeepsInputUntilStart(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('now')\nawait runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	res, err := a.c.Send(t.Context(), "default", api.SendRequest{Text: "while stopped", SourceKey: "stopped-1"})
	if err != nil || !strings.Contains(res.Unanswered, "klbr-core start default") {
		t.Fatalf("send to a stopped session: %+v %v", res, err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := model.Count(); n != 0 {
		t.Fatalf("%d requests while stopped", n)
	}
	if _, err := a.c.StartSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	a.eventually("answered after start", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
}

// An activation during a running attempt applies from the next attempt: the
// attempt's remaining steps send the old release's prompt, the next attempt
// the new one, and each attempt's record names its release.
func TestActivationDuringAnAttempt(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{Code: "import time\ntime.sleep(1.5)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('one')\nawait runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('two')\nawait runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("first")
	a.eventually("the long cell runs", func() bool { return len(a.kinds(store.LaneCell, "cell.started")) == 1 })
	rels, err := a.c.Releases(t.Context())
	if err != nil || len(rels.Sessions) == 0 {
		t.Fatalf("releases: %+v %v", rels, err)
	}
	var old api.Release
	for _, r := range rels.Releases {
		if r.ID == rels.Sessions[0].Release {
			old = r
		}
	}
	src := old.Path
	if _, err := os.Stat(filepath.Join(src, "tree", "soul.md")); err == nil {
		src = filepath.Join(src, "tree")
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.CopyFS(tree, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	const marker = "You are the NEW soul of this test."
	if err := os.WriteFile(filepath.Join(tree, "soul.md"), []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nr, err := a.c.Publish(t.Context(), tree)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Activate(t.Context(), "default", api.ActivateRequest{ExpectedEpoch: rels.Sessions[0].Epoch, Release: nr.ID}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the first attempt waits", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	if s := a.session(); s.Attempt == nil || s.Attempt.Release != old.ID {
		t.Fatalf("the first attempt's record names %+v, want release %s", s.Attempt, old.ID)
	}
	system := func(i int) string { return content(model.Requests()[i].Messages[0]) }
	if strings.Contains(system(0), marker) || strings.Contains(system(1), marker) {
		t.Fatal("the running attempt's steps took the prompt activated during it")
	}
	a.send("second")
	a.eventually("the second attempt waits", func() bool { return model.Count() == 3 && a.session().State == store.StateWaiting })
	if !strings.Contains(system(2), marker) {
		t.Fatalf("the next attempt's prompt is not the new release's: %q", system(2))
	}
	if s := a.session(); s.Attempt == nil || s.Attempt.Release != nr.ID {
		t.Fatalf("the second attempt's record names %+v, want release %s", s.Attempt, nr.ID)
	}
}
