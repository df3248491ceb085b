package daemon

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// startAgentTOML starts klbr-core with routesTOML as its klbr.toml after an
// [agent] table (agentTOML adds to it); env adds to its environment.
func startAgentTOML(t *testing.T, agentTOML, routesTOML string, env ...string) *agent {
	t.Helper()
	requirePython(t)
	data, base := instance(t)
	conf := filepath.Join(data, "klbr.toml")
	body := fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n%s\n%s", agentTOML, routesTOML)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	base = append(base, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)
	a := &agent{t: t, data: data, env: append(base, env...)}
	a.start()
	return a
}

func route(name string, s *modeltest.Server, extra string) string {
	return fmt.Sprintf("[routes.%s]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 30\n%s\n", name, s.URL(), extra)
}

// scratchpads returns the decoded scratchpad records.
func scratchpads(a *agent) []map[string]any {
	var out []map[string]any
	for _, r := range a.kinds(store.LaneScratchpad, "scratchpad") {
		var m map[string]any
		if err := json.Unmarshal(r.Content, &m); err != nil {
			a.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestDialectRoutesEndToEnd runs the agent against servers that refuse
// what the real ones refuse. With the right dialect a conversation with
// reasoning and tool calls goes through; a DeepSeek route left at the
// OpenAI default gets DeepSeek's 400, named in the model.error notice with
// the URL.
func TestDialectRoutesEndToEnd(t *testing.T) {
	script := []modeltest.Reply{
		{Reasoning: "I should run a cell.", Text: "Running.", Calls: []modeltest.Call{{Code: "x = 41"}}},
		{Reasoning: "Now answer.", Calls: []modeltest.Call{{Code: "await local.send(str(x + 1))\nawait runtime.wait(None, reason='done')"}}},
	}
	for _, tc := range []struct{ server, dialect string }{
		{modeltest.DeepSeek, "deepseek"},
		{modeltest.Mistral, "mistral"},
		{modeltest.OpenRouter, "openrouter"},
		{modeltest.Ollama, "ollama"},
	} {
		t.Run(tc.server, func(t *testing.T) {
			model := modeltest.NewDialect(tc.server)
			t.Cleanup(model.Close)
			model.Then(script...)
			a := startAgentTOML(t, "", route("main", model, fmt.Sprintf("dialect = %q", tc.dialect)))
			a.send("what is 41 + 1?")
			a.eventually("waiting", a.state(store.StateWaiting))
			if n := a.kinds(store.LaneNotice, "model.error"); len(n) != 0 {
				t.Fatalf("model errors: %s", n[0].Content)
			}
			if sp := a.kinds(store.LaneSpeech, "local.sent"); len(sp) != 1 || !strings.Contains(string(sp[0].Content), "42") {
				t.Fatalf("speech: %+v", sp)
			}
			pads := scratchpads(a)
			if pads[0]["reasoning"] != "I should run a cell." || pads[0]["route"] != "main" {
				t.Errorf("scratchpad: %v", pads[0])
			}
			reqs := model.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d requests", len(reqs))
			}
			_, so := reqs[0].Body["stream_options"]
			if so != (tc.server != modeltest.Mistral) {
				t.Errorf("stream_options sent: %v", so)
			}
			// What goes back on the assistant message of step 1.
			var back map[string]any
			for _, m := range reqs[1].Messages {
				if m["role"] == "assistant" {
					back = m
				}
			}
			switch tc.server {
			case modeltest.DeepSeek:
				if back["reasoning_content"] != "I should run a cell." {
					t.Errorf("deepseek: %v", back)
				}
			case modeltest.OpenRouter:
				if d, _ := json.Marshal(back["reasoning_details"]); !strings.Contains(string(d), "I should run a cell.") {
					t.Errorf("openrouter: %v", back)
				}
			default:
				if _, ok := back["reasoning_content"]; ok {
					t.Errorf("reasoning sent back to %s: %v", tc.server, back)
				}
			}
		})
	}
	t.Run("deepseek without its dialect", func(t *testing.T) {
		model := modeltest.NewDialect(modeltest.DeepSeek)
		t.Cleanup(model.Close)
		model.Then(script[0])
		a := startAgentTOML(t, "", route("main", model, ""))
		a.send("what is 41 + 1?")
		// A rejected request ends the attempt with its error; nothing retries it
		// by itself (the next input starts a new attempt).
		a.eventually("the rejection", func() bool {
			return len(a.kinds(store.LaneNotice, "model.error")) == 1 && a.session().State == store.StateReady
		})
		n := a.kinds(store.LaneNotice, "model.error")
		if len(n) != 1 || !strings.Contains(string(n[0].Content), "must be passed back to the API") ||
			!strings.Contains(string(n[0].Content), model.URL()+"/chat/completions") {
			t.Fatalf("model.error: %+v", n)
		}
		var notice map[string]any
		json.Unmarshal(n[0].Content, &notice)
		if notice["route"] != "main" || notice["url"] != model.URL() || notice["request_url"] != model.URL()+"/chat/completions" || notice["status"] != 400.0 ||
			notice["provider_code"] != "invalid_request_error" || !strings.Contains(fmt.Sprint(notice["provider_message"]), "reasoning_content") {
			t.Errorf("notice fields: %v", notice)
		}
	})
}

// TestInvalidArgumentsOnAStrictServer: a call whose arguments are not JSON
// is answered with an error that quotes them, and what is replayed is
// valid JSON, so a strict server keeps answering.
func TestInvalidArgumentsOnAStrictServer(t *testing.T) {
	model := modeltest.NewDialect(modeltest.Strict)
	t.Cleanup(model.Close)
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "bad", RawArguments: `{"code": "print(1)`}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "good", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentTOML(t, "", route("main", model, ""))
	a.send("go")
	a.eventually("waiting", a.state(store.StateWaiting))
	if n := a.kinds(store.LaneNotice, "model.error"); len(n) != 0 {
		t.Fatalf("model errors: %s", n[0].Content)
	}
	unrun := a.kinds(store.LaneCell, "tool.unrun")
	if len(unrun) != 1 || !strings.Contains(string(unrun[0].Content), `you wrote: \"{\\\"code\\\": \\\"print(1)\"`) {
		t.Fatalf("unrun: %+v", unrun)
	}
	// The record keeps what the model sent.
	if pads := scratchpads(a); !strings.Contains(fmt.Sprint(pads[0]["tool_calls"]), `{"code": "print(1)`) {
		t.Errorf("record: %v", pads[0])
	}
	msgs := model.Requests()[1].Messages
	var sent string
	for _, m := range msgs {
		if calls, ok := m["tool_calls"].([]any); ok {
			sent = calls[0].(map[string]any)["function"].(map[string]any)["arguments"].(string)
		}
	}
	if sent != "{}" {
		t.Errorf("replayed arguments %q", sent)
	}
}

// TestFallbackRoute: the main route down, the fallback answers and each
// step records it; the main route back, steps return to it.
func TestFallbackRoute(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	main := modeltest.New()
	t.Cleanup(main.Close)
	local := modeltest.New()
	t.Cleanup(local.Close)
	wait := modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	main.Otherwise(func(int) modeltest.Reply {
		if down.Load() {
			return modeltest.Reply{Status: 503, Body: `{"error":{"message":"the server is overloaded"}}`}
		}
		return wait
	})
	local.Otherwise(func(int) modeltest.Reply { return wait })
	a := startAgentTOML(t, "fallback = [\"local\"]\n", route("main", main, "")+route("local", local, "dialect = \"ollama\""))
	a.send("first")
	a.eventually("waiting", a.state(store.StateWaiting))
	if main.Count() < 1 || local.Count() != 1 {
		t.Fatalf("main %d, local %d requests", main.Count(), local.Count())
	}
	if n := a.kinds(store.LaneNotice, "model.error"); len(n) != 0 {
		t.Fatalf("the fallback answered, yet: %s", n[0].Content)
	}
	// status lists the plan's routes with their rest (the rest itself is
	// 50 ms here; the Router's tests prove its length).
	st, err := a.c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Routes) != 2 || st.Routes[0].Name != "local" || st.Routes[0].RestingSeconds != 0 || st.Routes[1].Name != "main" {
		t.Fatalf("status routes: %+v, want local (in use) and main", st.Routes)
	}
	down.Store(false)
	a.send("second")
	a.eventually("two steps", func() bool { return len(scratchpads(a)) == 2 })
	a.eventually("waiting", a.state(store.StateWaiting))
	pads := scratchpads(a)
	if pads[0]["route"] != "local" || pads[1]["route"] != "main" {
		t.Fatalf("routes: %v, %v", pads[0]["route"], pads[1]["route"])
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_model_requests_total{outcome="error_http",route="main"} 1`) ||
		!strings.Contains(m, `klbr_model_requests_total{outcome="ok",route="local"} 1`) ||
		!strings.Contains(m, `klbr_model_route_resting_seconds{route="local"} 0`) {
		t.Errorf("metrics:\n%s", grepLines(m, "klbr_model_requests_total"))
	}
}

// TestModelPlanHook: a model.plan that picks a route is followed; one that
// raises gets the default plan, and the invocation is recorded as an error.
func TestModelPlanHook(t *testing.T) {
	main := modeltest.New()
	t.Cleanup(main.Close)
	cheap := modeltest.New()
	t.Cleanup(cheap.Close)
	wait := func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	}
	main.Otherwise(wait)
	cheap.Otherwise(wait)
	flag := filepath.Join(t.TempDir(), "raise")
	// The shipped policy, then an edit: with a route named cheap, steps go
	// there first, unless the flag file exists; then the policy raises.
	tree := behaviorCopy(t, fmt.Sprintf(`

import os as _os

_shipped_plan = plan


def plan(data):
    out = _shipped_plan(data)
    if "cheap" not in {r["name"] for r in data["routes"]}:
        return out
    if _os.path.exists(%q):
        raise RuntimeError("this policy has a bug")
    return {"routes": ["cheap", "main"], "reason": "cheap first"}
`, flag))
	a := startAgentTOML(t, "", route("main", main, "")+route("cheap", cheap, ""), "KLBR_BEHAVIOR_DIR="+tree)
	a.send("first")
	a.eventually("waiting", a.state(store.StateWaiting))
	if main.Count() != 0 || cheap.Count() != 1 {
		t.Fatalf("model.plan's answer: main %d, cheap %d requests", main.Count(), cheap.Count())
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.send("second")
	a.eventually("two steps", func() bool { return len(scratchpads(a)) == 2 })
	a.eventually("waiting", a.state(store.StateWaiting))
	if main.Count() != 1 || cheap.Count() != 1 {
		t.Fatalf("a raising model.plan: main %d, cheap %d requests", main.Count(), cheap.Count())
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_hook_invocation_duration_seconds_count{outcome="error",slot="model.plan"} 1`) ||
		!strings.Contains(m, `klbr_hook_invocation_duration_seconds_count{outcome="ok",slot="model.plan"} 1`) {
		t.Errorf("metrics:\n%s", grepLines(m, "model.plan"))
	}
	if pads := scratchpads(a); pads[0]["route"] != "cheap" || pads[1]["route"] != "main" {
		t.Errorf("routes %v %v", pads[0]["route"], pads[1]["route"])
	}
}

// behaviorCopy copies the shipped behavior tree with edit appended to
// klbr_hooks/model.py.
func behaviorCopy(t *testing.T, edit string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "behavior")
	src := "../../behavior"
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == filepath.Join("klbr_hooks", "model.py") {
			b = append(b, edit...)
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
