package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
)

const testKey = "sk-test-SECRET-0123456789abcdef"

// fake is an OpenAI-compatible server that plays a scripted handler and
// records request bodies and auth headers. A test fixture only.
type fake struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
	auths  []string
}

func newFake(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *fake {
	t.Helper()
	f := &fake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		f.mu.Lock()
		f.bodies = append(f.bodies, m)
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) lastBody(t *testing.T) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		t.Fatal("no request reached the fake")
	}
	return f.bodies[len(f.bodies)-1]
}

func (f *fake) route() config.Route {
	return config.Route{URL: f.srv.URL + "/v1", Model: "m", APIKeyEnv: "TEST_KEY", TimeoutSeconds: 30}
}

// logs captures a client's log output at debug level.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(p) }
func (l *logs) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

func newClient(t *testing.T, r config.Route, lg *logs) *Client {
	t.Helper()
	opts := Options{LookupEnv: func(k string) (string, bool) {
		if k == "TEST_KEY" {
			return testKey, true
		}
		return "", false
	}}
	if lg != nil {
		opts.Logger = slog.New(slog.NewTextHandler(lg, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := New(r, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
	}
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

func asError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *provider.Error", err, err)
	}
	return e
}

func userMsg(s string) []Message { return []Message{{Role: "user", Content: s}} }

func TestRequestBodyCacheProfiles(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	})
	smuggled := `extra_options = { temperature = 0.5, prompt_cache_key = "evil", Cache_Control = "x", cache_prompt = true, prompt_cache_retention = "1h", prompt_cache_options = { key = "evil" } }`
	cases := []struct {
		name    string
		cache   string
		want    map[string]any
		stream  bool
		absence []string
	}{
		{"none", "", map[string]any{}, false,
			[]string{"prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"}},
		{"key", `cache_profile = "openai_prompt_cache_key"` + "\n" + `cache_affinity = "klbr:work"`,
			map[string]any{"prompt_cache_key": "klbr:work"}, true,
			[]string{"prompt_cache_retention", "prompt_cache_options"}},
		{"retention", `cache_profile = "openai_prompt_cache_retention"` + "\n" + `cache_affinity = "klbr:work"` + "\n" + `cache_retention = "24h"`,
			map[string]any{"prompt_cache_key": "klbr:work", "prompt_cache_retention": "24h"}, false,
			[]string{"prompt_cache_options"}},
		{"retention-unset", `cache_profile = "openai_prompt_cache_retention"` + "\n" + `cache_affinity = "klbr:work"`,
			map[string]any{"prompt_cache_key": "klbr:work"}, false,
			[]string{"prompt_cache_retention", "prompt_cache_options"}},
		{"options", `cache_profile = "openai_prompt_cache_options"` + "\n" + `cache_affinity = "klbr:work"` + "\n" + `cache_retention = "30m"`,
			map[string]any{"prompt_cache_options": map[string]any{"key": "klbr:work", "retention": "30m"}}, true,
			[]string{"prompt_cache_key", "prompt_cache_retention"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := fmt.Sprintf("[routes.main]\nurl = %q\nmodel = \"m\"\n%s\n%s\n", f.srv.URL+"/v1", tc.cache, smuggled)
			file, err := config.Parse("klbr.toml", []byte(doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			r, _ := file.AgentRoute()
			if len(r.StrippedOptions) == 0 {
				t.Errorf("Parse stripped nothing")
			}
			// A Route built in code is stripped by the client itself.
			r.ExtraOptions["prompt_cache_key"] = "evil"
			r.ExtraOptions["Cache_Control"] = "x"
			r.ExtraOptions["cache_prompt"] = true
			r.ExtraOptions["prompt_cache_options"] = map[string]any{"key": "evil"}
			r.ExtraOptions["stream"] = "no"
			c := newClient(t, r, nil)
			req := Request{Messages: userMsg("hi"), Tools: []Tool{PythonTool("run python")}, Stream: tc.stream}
			// The fake answers JSON even to a stream request; that is accepted.
			if _, err := c.Complete(context.Background(), req); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			body := f.lastBody(t)
			if body["model"] != "m" || body["temperature"] != 0.5 || body["stream"] != tc.stream {
				t.Errorf("body core fields: %v", body)
			}
			for k, v := range tc.want {
				got, _ := json.Marshal(body[k])
				want, _ := json.Marshal(v)
				if !bytes.Equal(got, want) {
					t.Errorf("%s = %s, want %s", k, got, want)
				}
			}
			for _, k := range append(tc.absence, "Cache_Control", "cache_prompt", "cache_control") {
				if _, ok := body[k]; ok {
					t.Errorf("body has %s: %v", k, body[k])
				}
			}
			if tc.stream {
				so, _ := json.Marshal(body["stream_options"])
				if string(so) != `{"include_usage":true}` {
					t.Errorf("stream_options = %s", so)
				}
			} else if _, ok := body["stream_options"]; ok {
				t.Errorf("stream_options on a non-streaming request")
			}
			tools, _ := json.Marshal(body["tools"])
			if !strings.Contains(string(tools), `"name":"python"`) || !strings.Contains(string(tools), `"code"`) {
				t.Errorf("tools = %s", tools)
			}
		})
	}
}

func TestMessageWireForm(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "s"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code":"1"}`}}},
			Extra: json.RawMessage(`{"reasoning_content":"why","z_block":{"a":[1,2]}}`)},
		{Role: "tool", ToolCallID: "c1", Content: "1"},
	}
	b, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"role":"system","content":"s"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"python","arguments":"{\"code\":\"1\"}"}}],"reasoning_content":"why","z_block":{"a":[1,2]}},` +
		`{"role":"tool","content":"1","tool_call_id":"c1"}]`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	if _, err := json.Marshal(Message{Role: "user", Extra: json.RawMessage(`{"content":"x"}`)}); err == nil {
		t.Error("Extra overriding content was accepted")
	}
}

func TestStreamAssemblesContentReasoningAndToolCalls(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": keep-alive\n\n")
		sse(w,
			`{"id":"r1","model":"m-1","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"Let me "}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"reasoning_content":"think."}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"content":"Running "}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"content":"two cells."}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"python","arguments":""}}]}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"python","arguments":"{\"co"}}]}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"code\": "}}]}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"de\": \"2\"}"}}]}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"1\"}"}}]}}]}`,
			`{"id":"r1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			`{"id":"r1","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":64}}}`,
			`[DONE]`)
	})
	c := newClient(t, f.route(), nil)
	var deltas []Delta
	resp, err := c.Complete(context.Background(), Request{Messages: userMsg("go"), Stream: true,
		OnDelta: func(d Delta) { deltas = append(deltas, d) }})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.Content != "Running two cells." || resp.Reasoning != "Let me think." || resp.ReasoningField != "reasoning_content" {
		t.Errorf("content %q reasoning %q (%s)", resp.Content, resp.Reasoning, resp.ReasoningField)
	}
	want := []ToolCall{
		{ID: "call_a", Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code": "1"}`}},
		{ID: "call_b", Type: "function", Function: FunctionCall{Name: "python", Arguments: `{"code": "2"}`}},
	}
	if fmt.Sprint(resp.ToolCalls) != fmt.Sprint(want) {
		t.Errorf("tool calls %+v, want %+v", resp.ToolCalls, want)
	}
	if resp.Incomplete != nil || resp.FinishReason != "tool_calls" {
		t.Errorf("incomplete %v finish %q", resp.Incomplete, resp.FinishReason)
	}
	if p := resp.Usage; *p.PromptTokens != 100 || *p.CompletionTokens != 20 || *p.CacheReadTokens != 64 || p.CacheWriteTokens != nil {
		t.Errorf("usage %+v", p)
	}
	if string(resp.Raw["model"]) != `"m-1"` || string(resp.Raw["id"]) != `"r1"` || resp.Raw["usage"] == nil {
		t.Errorf("raw %v", resp.Raw)
	}
	var text, reas, args strings.Builder
	for _, d := range deltas {
		text.WriteString(d.Content)
		reas.WriteString(d.Reasoning)
		if d.ToolCall != nil {
			args.WriteString(d.ToolCall.Arguments)
		}
	}
	if text.String() != resp.Content || reas.String() != resp.Reasoning || args.Len() != len(want[0].Function.Arguments)+len(want[1].Function.Arguments) {
		t.Errorf("deltas: %q %q %q", text.String(), reas.String(), args.String())
	}
	if auth := f.auths[0]; auth != "Bearer "+testKey {
		t.Errorf("Authorization header not sent")
	}
}

func TestStreamReasoningField(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, `{"choices":[{"index":0,"delta":{"reasoning":"r1 "}}]}`,
			`{"choices":[{"index":0,"delta":{"reasoning":"r2","reasoning_content":null,"content":"c"},"finish_reason":"stop"}]}`)
		// No [DONE]: a finish_reason is enough.
	})
	resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Reasoning != "r1 r2" || resp.ReasoningField != "reasoning" || resp.Content != "c" || resp.FinishReason != "stop" {
		t.Errorf("%+v", resp)
	}
	if resp.Usage.PromptTokens != nil {
		t.Errorf("usage inferred: %+v", resp.Usage)
	}
}

func ip(n int) *int { return &n }

func fp(f float64) *float64 { return &f }

func TestUsageVariants(t *testing.T) {
	cases := []struct {
		name, usage string
		want        Usage
	}{
		{"absent", ``, Usage{}},
		{"null", `,"usage":null`, Usage{}},
		{"openai cached", `,"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":8}}`,
			Usage{PromptTokens: ip(10), CompletionTokens: ip(2), TotalTokens: ip(12), CacheReadTokens: ip(8)}},
		{"openai write in details", `,"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":10}}`,
			Usage{PromptTokens: ip(10), CacheReadTokens: ip(0), CacheWriteTokens: ip(10)}},
		{"write top level", `,"usage":{"prompt_tokens":10,"cache_write_tokens":7}`,
			Usage{PromptTokens: ip(10), CacheWriteTokens: ip(7)}},
		{"deepseek", `,"usage":{"prompt_tokens":30,"completion_tokens":1,"prompt_cache_hit_tokens":24,"prompt_cache_miss_tokens":6}`,
			Usage{PromptTokens: ip(30), CompletionTokens: ip(1), CacheReadTokens: ip(24), CacheMissTokens: ip(6)}},
		{"explicit zero", `,"usage":{"prompt_tokens":0,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":0}}`,
			Usage{PromptTokens: ip(0), CompletionTokens: ip(0), CacheReadTokens: ip(0)}},
		{"openrouter cost", `,"usage":{"prompt_tokens":10,"completion_tokens":2,"cost":0.00042}`,
			Usage{PromptTokens: ip(10), CompletionTokens: ip(2), CostUSD: fp(0.00042)}},
		{"garbage cost", `,"usage":{"prompt_tokens":10,"cost":"0.1"}`, Usage{PromptTokens: ip(10)}},
		{"negative cost", `,"usage":{"prompt_tokens":10,"cost":-1}`, Usage{PromptTokens: ip(10)}},
		{"garbage values", `,"usage":{"prompt_tokens":"12","completion_tokens":-1,"total_tokens":1.5,"prompt_tokens_details":null}`,
			Usage{}},
	}
	show := func(u Usage) string {
		s := func(p *int) string {
			if p == nil {
				return "nil"
			}
			return fmt.Sprint(*p)
		}
		cost := "nil"
		if u.CostUSD != nil {
			cost = fmt.Sprint(*u.CostUSD)
		}
		return fmt.Sprintf("prompt=%s completion=%s total=%s read=%s write=%s miss=%s cost=%s",
			s(u.PromptTokens), s(u.CompletionTokens), s(u.TotalTokens), s(u.CacheReadTokens), s(u.CacheWriteTokens), s(u.CacheMissTokens), cost)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}]%s}`, tc.usage)
			})
			resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x")})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := show(resp.Usage), show(tc.want); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
			// The same usage in a stream's last chunk reads the same.
			f2 := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				sse(w, `{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}`,
					fmt.Sprintf(`{"choices":[]%s}`, tc.usage), `[DONE]`)
			})
			resp, err = newClient(t, f2.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := show(resp.Usage), show(tc.want); got != want {
				t.Errorf("stream: got  %s\nwant %s", got, want)
			}
		})
	}
}

func TestStreamCutMidToolCall(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, `{"choices":[{"index":0,"delta":{"content":"about to run"}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"python","arguments":"{\"code\": \"pri"}}]}}]}`)
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"argu`)
	})
	resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
	e := asError(t, err)
	if e.Kind != KindIncomplete || !e.Retryable() || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("error %v kind %v", err, e.Kind)
	}
	if resp == nil || resp.ToolCalls != nil {
		t.Fatalf("complete tool calls returned from a cut stream: %+v", resp)
	}
	if len(resp.Incomplete) != 1 || resp.Incomplete[0].Function.Arguments != `{"code": "pri` || resp.Content != "about to run" {
		t.Errorf("partial %+v", resp)
	}
}

func TestStreamMalformed(t *testing.T) {
	for name, tc := range map[string]struct {
		body      string
		kind      Kind
		retryable bool
	}{
		"bad json":        {"data: {not json}\n\n", KindProtocol, false},
		"content object":  {`data: {"choices":[{"index":0,"delta":{"content":{"x":1}}}]}` + "\n\n", KindProtocol, false},
		"error event":     {`data: {"error":{"message":"overloaded"}}` + "\n\n", KindProvider, true},
		"error 400 event": {`data: {"error":{"message":"bad","code":400}}` + "\n\n", KindProvider, false},
		"call without name": {`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n",
			KindProtocol, false},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, tc.body)
			})
			resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
			if e := asError(t, err); e.Kind != tc.kind || e.Retryable() != tc.retryable {
				t.Errorf("%v: kind %v retryable %v", err, e.Kind, e.Retryable())
			}
			if !strings.Contains(err.Error(), f.srv.URL+"/v1/chat/completions") {
				t.Errorf("error does not name the URL: %v", err)
			}
			if resp != nil && resp.ToolCalls != nil {
				t.Errorf("tool calls returned: %+v", resp.ToolCalls)
			}
		})
	}
}

func TestOversizedSSELine(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"`)
		io.WriteString(w, strings.Repeat("x", DefaultMaxSSELine))
		io.WriteString(w, `"}}]}`+"\n\ndata: [DONE]\n\n")
	})
	resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
	e := asError(t, err)
	if e.Kind != KindProtocol || !strings.Contains(err.Error(), "size limit") {
		t.Errorf("%v kind %v", err, e.Kind)
	}
	if resp != nil && len(resp.Content) > 0 {
		t.Errorf("content from an oversized line")
	}
}

func TestOversizedJSONBody(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[{"index":0,"message":{"content":"`+strings.Repeat("x", 2000)+`"}}]}`)
	})
	c := newClient(t, f.route(), nil)
	c.maxBody = 1000
	_, err := c.Complete(context.Background(), Request{Messages: userMsg("x")})
	if e := asError(t, err); e.Kind != KindProtocol || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("%v", err)
	}
}

func TestNonStreaming(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x1","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"hm",`+
			`"refusal":null,"thinking_blocks":[{"sig":"abc"}],`+
			`"tool_calls":[{"id":"c1","type":"function","function":{"name":"python","arguments":"{\"code\":\"1+1\"}"}}]},"finish_reason":"tool_calls"}]}`)
	})
	resp, err := newClient(t, f.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x")})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Content != "" || resp.Reasoning != "hm" || len(resp.ToolCalls) != 1 || resp.ToolCalls[0].ID != "c1" ||
		resp.ToolCalls[0].Function.Arguments != `{"code":"1+1"}` || resp.FinishReason != "tool_calls" || resp.Usage.PromptTokens != nil {
		t.Errorf("%+v", resp)
	}
	if string(resp.MessageExtra) != `{"refusal":null,"thinking_blocks":[{"sig":"abc"}]}` {
		t.Errorf("message extra %s", resp.MessageExtra)
	}
	if _, ok := resp.Raw["choices"]; ok || string(resp.Raw["id"]) != `"x1"` {
		t.Errorf("raw %v", resp.Raw)
	}
	// Truncated JSON is a protocol error.
	f2 := newFake(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"choices":[{"index":0,"mess`) })
	_, err = newClient(t, f2.route(), nil).Complete(context.Background(), Request{Messages: userMsg("x")})
	if e := asError(t, err); e.Kind != KindProtocol {
		t.Errorf("%v", err)
	}
}

func TestHTTPStatusClassification(t *testing.T) {
	cases := []struct {
		status    int
		retryable bool
	}{{429, true}, {500, true}, {503, true}, {400, false}, {401, false}, {404, false}}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(tc.status)
				fmt.Fprintf(w, `{"error":{"message":"status %d","auth":%q}}`+"\n%s", tc.status, r.Header.Get("Authorization"), strings.Repeat("y", 5000))
			})
			var lg logs
			_, err := newClient(t, f.route(), &lg).Complete(context.Background(), Request{Messages: userMsg("x")})
			e := asError(t, err)
			if e.Kind != KindHTTP || e.Status != tc.status || e.Retryable() != tc.retryable || IsRetryable(err) != tc.retryable {
				t.Errorf("%v: kind %v status %d retryable %v", err, e.Kind, e.Status, e.Retryable())
			}
			if !strings.Contains(e.Body, fmt.Sprintf("status %d", tc.status)) || len(e.Body) > maxErrorExcerpt+10 {
				t.Errorf("body excerpt %d bytes: %.80q", len(e.Body), e.Body)
			}
			if e.RetryAfter != 7*time.Second {
				t.Errorf("RetryAfter %v", e.RetryAfter)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(lg.String(), testKey) {
				t.Errorf("key leaked: %v\n%s", err, lg.String())
			}
			if !strings.Contains(err.Error(), "[redacted]") {
				t.Errorf("echoed key not redacted: %v", err)
			}
		})
	}
}

func TestNetworkErrorRetryable(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {})
	r := f.route()
	f.srv.Close()
	_, err := newClient(t, r, nil).Complete(context.Background(), Request{Messages: userMsg("x")})
	if e := asError(t, err); e.Kind != KindNetwork || !e.Retryable() {
		t.Errorf("%v kind %v", err, e.Kind)
	}
}

func settleGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after\n%s", before, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCancelMidStream(t *testing.T) {
	before := runtime.NumGoroutine()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sse(w, `{"choices":[{"index":0,"delta":{"content":"first"}}]}`)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	transport := &http.Transport{}
	r := config.Route{URL: srv.URL + "/v1", Model: "m", TimeoutSeconds: 60}
	c, err := New(r, Options{HTTPClient: &http.Client{Transport: transport}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	resp, err := c.Complete(ctx, Request{Messages: userMsg("x"), Stream: true, OnDelta: func(d Delta) {
		if d.Content == "first" {
			go func() { time.Sleep(50 * time.Millisecond); cancel() }()
		}
	}})
	elapsed := time.Since(start)
	e := asError(t, err)
	if e.Kind != KindCanceled || e.Retryable() || !errors.Is(err, context.Canceled) {
		t.Errorf("%v kind %v", err, e.Kind)
	}
	if elapsed > 2*time.Second {
		t.Errorf("cancel took %v", elapsed)
	}
	if resp == nil || resp.Content != "first" {
		t.Errorf("partial %+v", resp)
	}
	close(release)
	transport.CloseIdleConnections()
	srv.Close()
	settleGoroutines(t, before)
}

func TestRouteTimeout(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, `{"choices":[{"index":0,"delta":{"content":"slow"}}]}`)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	r := f.route()
	r.TimeoutSeconds = 1
	start := time.Now()
	_, err := newClient(t, r, nil).Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
	if e := asError(t, err); e.Kind != KindTimeout || !e.Retryable() {
		t.Errorf("%v kind %v", err, e.Kind)
	}
	if d := time.Since(start); d < time.Second || d > 3*time.Second {
		t.Errorf("timeout after %v", d)
	}
}

func TestKeyNeverLeaks(t *testing.T) {
	// The server echoes the Authorization header everywhere it can.
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch r.Header.Get("Accept") {
		case "text/event-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"error\":{\"message\":%q}}\n\n", auth)
		default:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, "bad key %s", auth)
		}
	})
	var lg logs
	var errs []string
	c := newClient(t, f.route(), &lg)
	for _, stream := range []bool{false, true} {
		_, err := c.Complete(context.Background(), Request{Messages: userMsg("x"), Stream: stream})
		if err == nil {
			t.Fatal("no error")
		}
		errs = append(errs, err.Error(), fmt.Sprintf("%+v %#v", err, err))
	}
	// Key file: read once, trimmed; errors about it name the file only.
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := os.WriteFile(path, []byte("\n"+testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.route()
	r.APIKeyEnv, r.APIKeyFile = "", path
	c2, err := New(r, Options{Logger: slog.New(slog.NewTextHandler(&lg, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if c2.key != testKey {
		t.Error("key file not trimmed")
	}
	_, err = c2.Complete(context.Background(), Request{Messages: userMsg("x")})
	errs = append(errs, err.Error())
	if err := os.WriteFile(path, []byte(testKey+"\x00junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = New(r, Options{})
	if err == nil {
		t.Error("key with a control character accepted")
	} else {
		errs = append(errs, err.Error())
	}
	// A FIFO named as the key file is refused at once instead of
	// blocking start-up until something writes to it.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err == nil {
		r.APIKeyFile = fifo
		if _, err := New(r, Options{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("FIFO key file: %v, want a not-a-regular-file error", err)
		}
	}
	_, err = New(config.Route{URL: "http://x/v1", Model: "m", APIKeyEnv: "MISSING"}, Options{LookupEnv: func(string) (string, bool) { return "", false }})
	if err == nil || !strings.Contains(err.Error(), "MISSING") {
		t.Errorf("missing env: %v", err)
	}
	all := strings.Join(errs, "\n") + lg.String()
	if strings.Contains(all, testKey) || strings.Contains(all, "SECRET") {
		t.Errorf("key leaked:\n%s", all)
	}
	if !strings.Contains(lg.String(), "provider: request") {
		t.Errorf("logs not captured: %s", lg.String())
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(config.Route{URL: "http://x/v1"}, Options{}); err == nil {
		t.Error("route without model accepted")
	}
	if _, err := New(config.Route{URL: "http://x/v1", Model: "m", CacheProfile: "bogus"}, Options{}); err == nil {
		t.Error("unknown cache profile accepted")
	}
}
