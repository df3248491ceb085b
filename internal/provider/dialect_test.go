package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/modeltest"
)

// converse runs a three-step conversation against a server of the dialect
// the way the turn loop does: each response goes back into the next
// request, a tool result answers each call. It returns the responses.
func converse(t *testing.T, srv *modeltest.Server, route config.Route) []*Response {
	t.Helper()
	c, err := New(route, Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "go"}}
	var out []*Response
	for step := 0; step < 3; step++ {
		resp, err := c.Complete(context.Background(), Request{Messages: msgs, Tools: []Tool{PythonTool("p")}, Stream: step != 1})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		out = append(out, resp)
		m := Message{Role: "assistant", Content: resp.Content, ToolCalls: resp.ToolCalls, Reasoning: &Reasoning{Text: resp.Reasoning, Details: resp.ReasoningDetails}}
		msgs = append(msgs, m)
		for _, tc := range resp.ToolCalls {
			msgs = append(msgs, Message{Role: "tool", ToolCallID: tc.ID, Content: "status: ok"})
		}
		if len(resp.ToolCalls) == 0 {
			msgs = append(msgs, Message{Role: "user", Content: "again"})
		}
	}
	return out
}

// TestDialectsEndToEnd talks to servers that answer in each dialect's
// format and refuse what the real server refuses: Mistral's 422 on
// stream_options and 400 on foreign call ids, DeepSeek's 400 when
// thinking-mode reasoning is not passed back, a strict server's 400 on
// arguments that are not JSON.
func TestDialectsEndToEnd(t *testing.T) {
	script := []modeltest.Reply{
		{Reasoning: "first think", Text: "calling", Calls: []modeltest.Call{{ID: "call_abc_1", Code: "x = 1"}, {ID: "call_abc_2", RawArguments: `{"code": "y = `}}},
		{Reasoning: "then", Calls: []modeltest.Call{{ID: "call_abc_1", Code: "print(x)"}}},
		{Reasoning: "done", Text: "all done"},
	}
	cases := []struct {
		server, dialect string
		check           func(t *testing.T, reqs []modeltest.Request, resps []*Response)
	}{
		{modeltest.DeepSeek, config.DialectDeepSeek, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			// Every assistant message carries its reasoning_content, as
			// it was.
			last := reqs[len(reqs)-1].Messages
			var got []string
			for _, m := range last {
				if m["role"] == "assistant" {
					rc, ok := m["reasoning_content"].(string)
					if !ok {
						t.Errorf("assistant message without reasoning_content: %v", m)
					}
					got = append(got, rc)
				}
			}
			if strings.Join(got, "|") != "first think|then" {
				t.Errorf("reasoning passed back: %q", got)
			}
		}},
		{modeltest.Mistral, config.DialectMistral, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			if _, ok := reqs[0].Body["stream_options"]; ok {
				t.Error("stream_options sent to Mistral")
			}
			if resps[0].Reasoning != "first think" || resps[0].ReasoningField != "content.thinking" {
				t.Errorf("thinking parts: %q %q", resps[0].Reasoning, resps[0].ReasoningField)
			}
		}},
		{modeltest.Strict, config.DialectOpenAI, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			calls := reqs[1].Messages[2]["tool_calls"].([]any)
			if args := calls[1].(map[string]any)["function"].(map[string]any)["arguments"]; args != "{}" {
				t.Errorf("invalid arguments replayed as %q", args)
			}
			// The repeated id of step 2 is replayed under a new one.
			ids := map[string]bool{}
			for _, m := range reqs[2].Messages {
				cs, _ := m["tool_calls"].([]any)
				for _, c := range cs {
					id := c.(map[string]any)["id"].(string)
					if ids[id] {
						t.Errorf("id %s sent twice", id)
					}
					ids[id] = true
				}
			}
		}},
		{modeltest.LlamaCpp, config.DialectLlamaCpp, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			if resps[0].Usage.PromptTokens == nil || resps[0].Usage.CacheReadTokens == nil || *resps[0].Usage.CacheReadTokens != 0 {
				t.Errorf("llama.cpp usage and timings: %+v", resps[0].Usage)
			}
		}},
		{modeltest.VLLM, config.DialectVLLM, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			if resps[0].ReasoningField != "reasoning" {
				t.Errorf("field %q", resps[0].ReasoningField)
			}
		}},
		{modeltest.Ollama, config.DialectOllama, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			if len(resps[0].ToolCalls) != 2 || resps[0].ToolCalls[0].ID != "call_abc_1" || resps[0].ToolCalls[1].ID != "call_abc_2" {
				t.Errorf("parallel calls at index 0: %+v", resps[0].ToolCalls)
			}
		}},
		{modeltest.OpenRouter, config.DialectOpenRouter, func(t *testing.T, reqs []modeltest.Request, resps []*Response) {
			m := reqs[1].Messages[2]
			d, _ := json.Marshal(m["reasoning_details"])
			if !strings.Contains(string(d), `"text":"first think"`) {
				t.Errorf("reasoning_details not passed back: %v", m)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.server, func(t *testing.T) {
			srv := modeltest.NewDialect(tc.server)
			t.Cleanup(srv.Close)
			srv.Then(script...)
			resps := converse(t, srv, config.Route{URL: srv.URL(), Model: "fake", Dialect: tc.dialect, TimeoutSeconds: 30})
			if resps[0].Content != "calling" || resps[2].Content != "all done" || len(resps[0].ToolCalls) != 2 {
				t.Errorf("responses: %+v", resps[0])
			}
			tc.check(t, srv.Requests(), resps)
		})
	}
}

// TestDialectsRefuseTheOpenAIDefault shows that each strict server refuses
// what an OpenAI-dialect route sends it: the rules are real.
func TestDialectsRefuseTheOpenAIDefault(t *testing.T) {
	script := []modeltest.Reply{
		{Reasoning: "r", Calls: []modeltest.Call{{ID: "call_abc_1", RawArguments: `{"code": "x`}}},
		{Text: "unreachable"},
	}
	for _, tc := range []struct {
		server string
		status int
		msg    string
	}{
		{modeltest.Mistral, 422, "extra_forbidden"},
		{modeltest.DeepSeek, 400, "must be passed back"},
	} {
		t.Run(tc.server, func(t *testing.T) {
			srv := modeltest.NewDialect(tc.server)
			t.Cleanup(srv.Close)
			srv.Then(script...)
			c, _ := New(config.Route{URL: srv.URL(), Model: "fake", TimeoutSeconds: 30}, Options{})
			msgs := []Message{{Role: "user", Content: "go"}}
			var err error
			for i := 0; i < 2 && err == nil; i++ {
				var resp *Response
				resp, err = c.Complete(context.Background(), Request{Messages: msgs, Stream: true})
				if err == nil {
					msgs = append(msgs, Message{Role: "assistant", ToolCalls: resp.ToolCalls}, Message{Role: "tool", ToolCallID: resp.ToolCalls[0].ID, Content: "x"})
				}
			}
			e := asError(t, err)
			if e.Status != tc.status || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), srv.URL()+"/chat/completions") {
				t.Errorf("%v", err)
			}
		})
	}
}

func TestDialectOverrides(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		route       config.Route
		streamUsage bool
		replay      Replay
	}{
		{config.Route{}, true, ReplayNone},
		{config.Route{Dialect: "mistral"}, false, ReplayNone},
		{config.Route{Dialect: "mistral", StreamUsage: &yes}, true, ReplayNone},
		{config.Route{Dialect: "deepseek"}, true, ReplayDeepSeek},
		{config.Route{Dialect: "deepseek", ReasoningReplay: &no}, true, ReplayNone},
		{config.Route{Dialect: "vllm", ReasoningReplay: &yes}, true, ReplayReasoning},
		{config.Route{Dialect: "llama.cpp", ReasoningReplay: &yes, StreamUsage: &no}, false, ReplayReasoningContent},
		{config.Route{Dialect: "openrouter"}, true, ReplayReasoningDetails},
	} {
		d, err := DialectOf(tc.route)
		if err != nil || d.StreamUsage != tc.streamUsage || d.Replay != tc.replay {
			t.Errorf("%+v: %+v %v", tc.route, d, err)
		}
	}
	if _, err := DialectOf(config.Route{Dialect: "anthropic"}); err == nil {
		t.Error("unknown dialect accepted")
	}
}

// TestReplayDeepSeekSpans: reasoning_content goes on every assistant
// message, as stored ("" when none was): on a user turn that called a tool
// (DeepSeek requires it) and on one that did not (DeepSeek ignores it).
func TestReplayDeepSeekSpans(t *testing.T) {
	d, _ := DialectOf(config.Route{Dialect: "deepseek"})
	call := ToolCall{ID: "c1", Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code":"1"}`}}
	msgs := []Message{
		{Role: "system", Content: "s"},
		{Role: "user", Content: "q1"},
		{Role: "assistant", Content: "plain", Reasoning: &Reasoning{Text: "r0"}},
		{Role: "user", Content: "q2"},
		{Role: "assistant", ToolCalls: []ToolCall{call}, Reasoning: &Reasoning{Text: "r1"}},
		{Role: "tool", ToolCallID: "c1", Content: "1"},
		{Role: "assistant", Content: "answer"},
	}
	b, err := json.Marshal(replay(d, msgs))
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	json.Unmarshal(b, &got)
	if got[2]["reasoning_content"] != "r0" || got[4]["reasoning_content"] != "r1" || got[6]["reasoning_content"] != "" {
		t.Errorf("reasoning_content: %v / %v / %v", got[2], got[4], got[6])
	}
	if _, ok := got[1]["reasoning_content"]; ok {
		t.Errorf("reasoning_content on a user message: %v", got[1])
	}
}

// TestReplayStable: the same history is sent byte for byte the same on
// every request, however it grows (prompt caches see one prefix).
func TestReplayStable(t *testing.T) {
	d, _ := DialectOf(config.Route{Dialect: "mistral"})
	call := func(id string) ToolCall {
		return ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code":`}}
	}
	msgs := []Message{{Role: "user", Content: "q"}, {Role: "assistant", ToolCalls: []ToolCall{call("call_x"), call("")}},
		{Role: "tool", ToolCallID: "call_x"}, {Role: "tool", ToolCallID: ""}}
	first, _ := json.Marshal(replay(d, msgs))
	more := append(msgs, Message{Role: "assistant", ToolCalls: []ToolCall{call("call_x")}}, Message{Role: "tool", ToolCallID: "call_x"})
	second, _ := json.Marshal(replay(d, more))
	if !strings.HasPrefix(string(second), strings.TrimSuffix(string(first), "]")) {
		t.Errorf("prefix changed:\n%s\n%s", first, second)
	}
}

// BenchmarkRequestBody measures building a request body from a 400-message
// history (200 steps of one call each) in two dialects, replay
// included (openai: ids and arguments checked; deepseek: reasoning sent
// back too), beside marshaling the same messages without replay, the
// baseline that every request paid before.
func BenchmarkRequestBody(b *testing.B) {
	msgs := []Message{{Role: "system", Content: strings.Repeat("s", 4000)}, {Role: "user", Content: "go"}}
	for i := 0; i < 200; i++ {
		msgs = append(msgs, Message{Role: "assistant", Content: "step", Reasoning: &Reasoning{Text: strings.Repeat("r", 200)},
			ToolCalls: []ToolCall{{ID: fmt.Sprintf("call_%d", i), Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code": "n = n + 1"}`}}}},
			Message{Role: "tool", ToolCallID: fmt.Sprintf("call_%d", i), Content: "status: ok\nvalue: 1"})
	}
	req := Request{Messages: msgs, Tools: []Tool{PythonTool("p")}, Stream: true}
	b.Run("op=marshal-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(map[string]any{"model": "m", "messages": msgs, "tools": req.Tools, "stream": true}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, d := range []string{"openai", "deepseek"} {
		c, err := New(config.Route{URL: "http://x/v1", Model: "m", Dialect: d}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("op=body/dialect="+d, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.requestBody(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestRequestBodySchemas checks each dialect's request body against the
// fields its server documents: the top-level fields, the fields of each
// message, and the form of tool call ids.
func TestRequestBodySchemas(t *testing.T) {
	call := ToolCall{ID: "call_PTLP8xhu3uwZk4l3nlnrrJha", Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code":"1"}`}}
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "u"},
		{Role: "assistant", Content: "c", ToolCalls: []ToolCall{call}, Reasoning: &Reasoning{Text: "r", Details: json.RawMessage(`[{"type":"reasoning.text","text":"r"}]`)}},
		{Role: "tool", ToolCallID: call.ID, Content: "ok"}, {Role: "assistant", Content: "done", Reasoning: &Reasoning{Text: "r2"}}}
	base := []string{"role", "content", "tool_calls", "tool_call_id"}
	for _, tc := range []struct {
		dialect  string
		top      []string
		message  []string // beyond base
		mistral  bool     // ids must be 9 alphanumerics
		reasoned int      // assistant messages that carry reasoning
	}{
		{"openai", []string{"model", "messages", "tools", "stream", "stream_options"}, nil, false, 0},
		{"deepseek", []string{"model", "messages", "tools", "stream", "stream_options"}, []string{"reasoning_content"}, false, 2},
		{"mistral", []string{"model", "messages", "tools", "stream"}, nil, true, 0},
		{"llama.cpp", []string{"model", "messages", "tools", "stream", "stream_options"}, nil, false, 0},
		{"vllm", []string{"model", "messages", "tools", "stream", "stream_options"}, nil, false, 0},
		{"ollama", []string{"model", "messages", "tools", "stream", "stream_options"}, nil, false, 0},
		{"openrouter", []string{"model", "messages", "tools", "stream", "stream_options"}, []string{"reasoning_details"}, false, 1},
	} {
		t.Run(tc.dialect, func(t *testing.T) {
			c, err := New(config.Route{URL: "http://x/v1", Model: "m", Dialect: tc.dialect}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.requestBody(Request{Messages: msgs, Tools: []Tool{PythonTool("p")}, Stream: true})
			if err != nil {
				t.Fatal(err)
			}
			var body map[string]json.RawMessage
			json.Unmarshal(b, &body)
			for k := range body {
				if !slices.Contains(tc.top, k) {
					t.Errorf("top-level field %q", k)
				}
			}
			for _, k := range tc.top {
				if _, ok := body[k]; !ok {
					t.Errorf("missing %q", k)
				}
			}
			var ms []map[string]json.RawMessage
			json.Unmarshal(body["messages"], &ms)
			reasoned := 0
			for _, m := range ms {
				for k := range m {
					if !slices.Contains(base, k) && !slices.Contains(tc.message, k) {
						t.Errorf("message field %q in %s", k, m["role"])
					}
					if slices.Contains(tc.message, k) {
						reasoned++
					}
				}
				var calls []struct {
					ID string `json:"id"`
				}
				json.Unmarshal(m["tool_calls"], &calls)
				ids := []string{}
				for _, c := range calls {
					ids = append(ids, c.ID)
				}
				if raw, ok := m["tool_call_id"]; ok {
					var id string
					json.Unmarshal(raw, &id)
					ids = append(ids, id)
				}
				for _, id := range ids {
					if tc.mistral && !(len(id) == 9 && isAlnum(id)) {
						t.Errorf("id %q sent to Mistral", id)
					}
				}
			}
			if reasoned != tc.reasoned {
				t.Errorf("%d messages carry reasoning, want %d", reasoned, tc.reasoned)
			}
		})
	}
}

// TestDeepSeekReplayKeepsThePrefix: two consecutive requests to a DeepSeek
// server, the second extending the first with an assistant message that
// calls a tool in the same user turn. What the first sent is the second's
// prefix, byte for byte: an earlier assistant message of the turn does not
// gain a reasoning_content it was sent without (DeepSeek ignores it on a
// turn without tool calls and requires it on one with them).
func TestDeepSeekReplayKeepsThePrefix(t *testing.T) {
	srv := modeltest.NewDialect(modeltest.DeepSeek)
	defer srv.Close()
	srv.Then(modeltest.Reply{Reasoning: "r1", Calls: []modeltest.Call{{ID: "c1", Code: "1"}}}, modeltest.Reply{Text: "done"})
	c, err := New(config.Route{URL: srv.URL(), Model: "m", Dialect: config.DialectDeepSeek}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "q"},
		{Role: "assistant", Content: "let me look", Reasoning: &Reasoning{Text: "r0"}}}
	resp, err := c.Complete(t.Context(), Request{Messages: msgs, Tools: []Tool{PythonTool("p")}})
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, Message{Role: "assistant", ToolCalls: resp.ToolCalls, Reasoning: &Reasoning{Text: resp.Reasoning}},
		Message{Role: "tool", ToolCallID: resp.ToolCalls[0].ID, Content: "status: ok"})
	if _, err := c.Complete(t.Context(), Request{Messages: msgs, Tools: []Tool{PythonTool("p")}}); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	first, _ := json.Marshal(reqs[0].Messages)
	second, _ := json.Marshal(reqs[1].Messages[:len(reqs[0].Messages)])
	if string(first) != string(second) {
		t.Fatalf("the second request changed the first's messages:\n%s\n%s", first, second)
	}
	if rc, ok := reqs[1].Messages[3]["reasoning_content"].(string); !ok || rc != "r1" {
		t.Fatalf("the calling message's reasoning_content: %v", reqs[1].Messages[3])
	}
}
