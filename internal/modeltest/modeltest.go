// Package modeltest is an OpenAI-compatible /chat/completions server that
// plays scripted responses, for tests of the turn loop. It records every
// request it receives. A test fixture: the product never takes this path.
package modeltest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Call is a scripted tool call of the python tool.
type Call struct {
	ID   string
	Code string
	// Name and RawArguments override the python tool and {"code": Code}:
	// for tests of invalid calls.
	Name         string
	RawArguments string
}

// Reply is one scripted response.
type Reply struct {
	Text      string
	Reasoning string
	Calls     []Call
	Usage     map[string]any // the usage object as sent; nil sends none

	// Failure modes, instead of a response.
	Status    int               // an HTTP error status with Body
	Header    map[string]string // headers of the error (e.g. Retry-After)
	Body      string            // raw body: sent as is (malformed JSON, broken SSE)
	Drop      bool              // close the connection without a response (a route going down)
	Truncate  bool              // stream the reply, then cut the connection before [DONE]
	Hold      <-chan struct{}
	HoldAfter int // with Hold: stream this many content chunks, then hold until Hold closes or the client leaves
	// Gone, with Hold, is closed when the client leaves while held (its
	// request was cancelled).
	Gone chan struct{}
}

// Request is a request the server received.
type Request struct {
	Messages []map[string]any
	Tools    []any
	Stream   bool
	Body     map[string]any
	// PromptTokens and CachedTokens are the prompt's size and the part
	// of it served from the emulated prefix cache (EmulatePrefixCache).
	PromptTokens, CachedTokens int
}

// Dialects the server can speak: the response forms and request rules of
// real servers, from their documentation and public bug reports (see
// docs/agent.md). "" is a plain OpenAI-compatible server.
const (
	DeepSeek   = "deepseek"   // reasoning_content; 400 when thinking-mode reasoning_content is not passed back
	Mistral    = "mistral"    // content as typed parts; 422 on stream_options; 400 on tool call ids not [a-zA-Z0-9]{9}
	LlamaCpp   = "llama.cpp"  // reasoning_content; usage and timings in a last chunk, always
	VLLM       = "vllm"       // reasoning; errors as {"object":"error"}
	Ollama     = "ollama"     // reasoning; every parallel call at index 0, each whole
	OpenRouter = "openrouter" // ": OPENROUTER PROCESSING" comments; reasoning and reasoning_details
	Strict     = "strict"     // a plain server that answers 400 to tool call arguments that are not JSON (DashScope)
)

// Server plays a script.
type Server struct {
	srv     *httptest.Server
	dialect string
	models  []string // what GET /v1/models lists; nil: "fake"
	key     string   // when set, requests must bring "Bearer "+key

	mu       sync.Mutex
	script   []Reply
	fallback func(n int) Reply
	answer   func(n int, req Request) Reply
	toolFree func(req Request) Reply
	requests []Request
	arrived  chan struct{}
	cache    *prefixCache // nil: no cache emulated
}

// New starts a server. Close it with Close (tests: t.Cleanup(s.Close)).
func New() *Server { return NewDialect("") }

// NewDialect starts a server that answers in a dialect and refuses what the
// real server refuses. Refused requests are recorded too.
func NewDialect(dialect string) *Server {
	s := &Server{arrived: make(chan struct{}, 1024), dialect: dialect}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the route's base URL (…/v1).
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// Close stops the server.
func (s *Server) Close() { s.srv.CloseClientConnections(); s.srv.Close() }

// ListModels sets what GET /v1/models lists (default: "fake").
func (s *Server) ListModels(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models = ids
}

// RequireKey makes the server answer 401 to requests without the key.
func (s *Server) RequireKey(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = key
}

// Then appends replies to the script.
func (s *Server) Then(r ...Reply) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, r...)
	return s
}

// Otherwise answers requests past the end of the script (n counts every
// request, from 1). Without it such a request gets a 500 "script exhausted".
func (s *Server) Otherwise(f func(n int) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fallback = f
}

// Answer answers requests past the end of the script by what they carry
// (n counts every request, from 1), before Otherwise: tests whose sessions
// ask concurrently tell them apart by their messages. f runs under the
// server's lock: it must not block (a Reply with Hold holds outside it).
func (s *Server) Answer(f func(n int, req Request) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer = f
}

// ToolFree answers requests that carry no tools (summaries) with f,
// apart from the script, which keeps answering the agent's requests.
func (s *Server) ToolFree(f func(req Request) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.toolFree = f
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count is the number of requests received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// Arrived signals each request as it arrives.
func (s *Server) Arrived() <-chan struct{} { return s.arrived }

// WaitFor blocks until n requests have arrived or d passes; it reports whether they did.
func (s *Server) WaitFor(n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s.Count() >= n {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s.Count() >= n
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	key, models := s.key, s.models
	s.mu.Unlock()
	if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}`)
		return
	}
	if r.URL.Path == "/v1/models" && r.Method == http.MethodGet {
		if models == nil {
			models = []string{"fake"}
		}
		data := make([]any, len(models))
		for i, m := range models {
			data[i] = map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "klbr-test"}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
		return
	}
	if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		http.Error(w, "request is not JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := Request{Body: body}
	if msgs, ok := body["messages"].([]any); ok {
		for _, m := range msgs {
			if mm, ok := m.(map[string]any); ok {
				req.Messages = append(req.Messages, mm)
			}
		}
	}
	req.Tools, _ = body["tools"].([]any)
	req.Stream, _ = body["stream"].(bool)
	s.mu.Lock()
	if s.cache != nil {
		req.PromptTokens, req.CachedTokens = s.cache.serve(b)
	}
	s.requests = append(s.requests, req)
	n := len(s.requests)
	if status, msg := refuse(s.dialect, req); status != 0 {
		s.mu.Unlock()
		select {
		case s.arrived <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, msg)
		return
	}
	cached := s.cache != nil
	var reply Reply
	var ok bool
	if tf := s.toolFree; len(req.Tools) == 0 && tf != nil {
		s.mu.Unlock()
		select {
		case s.arrived <- struct{}{}:
		default:
		}
		reply := tf(req)
		if cached {
			reply.Usage = cacheUsage(reply.Usage, req)
		}
		play(w, r, reply, req.Stream, n, s.dialect) // outside the lock: it may block (a hung summarizer)
		return
	}
	if len(s.script) > 0 {
		reply, s.script, ok = s.script[0], s.script[1:], true
	} else if s.answer != nil {
		reply, ok = s.answer(n, req), true
	} else if s.fallback != nil {
		reply, ok = s.fallback(n), true
	}
	s.mu.Unlock()
	select {
	case s.arrived <- struct{}{}:
	default:
	}
	if !ok {
		http.Error(w, `{"error":{"message":"script exhausted"}}`, http.StatusInternalServerError)
		return
	}
	if cached {
		reply.Usage = cacheUsage(reply.Usage, req)
	}
	play(w, r, reply, req.Stream, n, s.dialect)
}

func (r Reply) gone() {
	if r.Gone != nil {
		close(r.Gone)
	}
}

func play(w http.ResponseWriter, r *http.Request, reply Reply, stream bool, n int, dialect string) {
	if reply.Drop {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if reply.Status != 0 {
		for k, v := range reply.Header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(reply.Status)
		io.WriteString(w, reply.Body)
		return
	}
	if reply.Body != "" {
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		io.WriteString(w, reply.Body)
		return
	}
	calls := make([]map[string]any, len(reply.Calls))
	for i, c := range reply.Calls {
		name, args := c.Name, c.RawArguments
		if name == "" {
			name = "python"
		}
		if args == "" {
			a, _ := json.Marshal(map[string]string{"code": c.Code})
			args = string(a)
		}
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", n, i)
			if dialect == Mistral {
				id = fmt.Sprintf("Call%02dx%02d", n%100, i%100) // Mistral's ids are 9 alphanumerics
			}
		}
		calls[i] = map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args}}
	}
	finish := "stop"
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	if !stream {
		msg := map[string]any{"role": "assistant", "content": reply.Text}
		if reply.Reasoning != "" {
			switch dialect {
			case Mistral:
				msg["content"] = []any{map[string]any{"type": "thinking", "thinking": []any{map[string]any{"type": "text", "text": reply.Reasoning}}},
					map[string]any{"type": "text", "text": reply.Text}}
			case VLLM, Ollama:
				msg["reasoning"] = reply.Reasoning
			case OpenRouter:
				msg["reasoning"] = reply.Reasoning
				msg["reasoning_details"] = []any{map[string]any{"type": "reasoning.text", "text": reply.Reasoning, "format": "unknown", "index": 0}}
			default:
				msg["reasoning_content"] = reply.Reasoning
			}
		}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		out := map[string]any{"id": fmt.Sprintf("cmpl-%d", n), "object": "chat.completion", "model": "fake",
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}}}
		if reply.Usage != nil {
			out["usage"] = reply.Usage
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	chunk := func(delta map[string]any, finish any) {
		c := map[string]any{"id": fmt.Sprintf("cmpl-%d", n), "object": "chat.completion.chunk", "model": "fake",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	chunk(map[string]any{"role": "assistant"}, nil)
	if dialect == OpenRouter {
		io.WriteString(w, ": OPENROUTER PROCESSING\n\n")
	}
	if reply.Reasoning != "" {
		for _, piece := range splitWords(reply.Reasoning) {
			switch dialect {
			case Mistral:
				chunk(map[string]any{"content": []any{map[string]any{"type": "thinking", "thinking": []any{map[string]any{"type": "text", "text": piece}}}}}, nil)
			case VLLM, Ollama:
				chunk(map[string]any{"reasoning": piece}, nil)
			case OpenRouter:
				chunk(map[string]any{"content": "", "reasoning": piece,
					"reasoning_details": []any{map[string]any{"type": "reasoning.text", "text": piece, "format": "unknown", "index": 0}}}, nil)
			default:
				chunk(map[string]any{"reasoning_content": piece}, nil)
			}
		}
	}
	words := splitWords(reply.Text)
	for i, wd := range words {
		if reply.Hold != nil && i == reply.HoldAfter {
			select {
			case <-reply.Hold:
			case <-r.Context().Done():
				reply.gone()
				return
			}
		}
		chunk(map[string]any{"content": wd}, nil)
	}
	if reply.Hold != nil && len(words) <= reply.HoldAfter {
		select {
		case <-reply.Hold:
		case <-r.Context().Done():
			reply.gone()
			return
		}
	}
	for i, c := range calls {
		fn := c["function"].(map[string]any)
		args := fn["arguments"].(string)
		if dialect == Ollama || dialect == Mistral {
			// Each call whole in one delta; Ollama gives every call index 0.
			idx := i
			if dialect == Ollama {
				idx = 0
			}
			if reply.Truncate {
				return
			}
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": idx, "id": c["id"], "type": "function",
				"function": map[string]any{"name": fn["name"], "arguments": args}}}}, nil)
			continue
		}
		half := len(args) / 2
		for half > 0 && !utf8.RuneStart(args[half]) {
			half-- // a provider's delta is a JSON string: it never splits a character
		}
		chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c["id"], "type": "function",
			"function": map[string]any{"name": fn["name"], "arguments": args[:half]}}}}, nil)
		if reply.Truncate {
			return // the connection ends mid-call, without [DONE]
		}
		chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": args[half:]}}}}, nil)
	}
	if reply.Truncate {
		return
	}
	usage := reply.Usage
	switch dialect {
	case Mistral:
		// Mistral sends usage in the last chunk, with the finish_reason,
		// and refuses to be asked for it.
		c := map[string]any{"id": fmt.Sprintf("cmpl-%d", n), "object": "chat.completion.chunk", "model": "fake",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": ""}, "finish_reason": finish}}}
		if usage != nil {
			c["usage"] = usage
		}
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		return
	case LlamaCpp:
		if usage == nil {
			usage = map[string]any{"completion_tokens": 1, "prompt_tokens": 1, "total_tokens": 2}
		}
	}
	chunk(map[string]any{}, finish)
	if usage != nil {
		c := map[string]any{"id": fmt.Sprintf("cmpl-%d", n), "object": "chat.completion.chunk", "choices": []any{}, "usage": usage}
		if dialect == LlamaCpp {
			c["timings"] = map[string]any{"cache_n": 0, "prompt_n": 1, "prompt_ms": 1.5, "predicted_n": 1, "predicted_ms": 2.5}
		}
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// refuse answers a request the way the dialect's real server refuses it,
// or returns status 0.
func refuse(dialect string, req Request) (int, string) {
	switch dialect {
	case Mistral:
		if so, ok := req.Body["stream_options"]; ok {
			in, _ := json.Marshal(so)
			return http.StatusUnprocessableEntity, fmt.Sprintf(`{"object":"error","message":{"detail":[{"type":"extra_forbidden","loc":["body","stream_options"],"msg":"Extra inputs are not permitted","input":%s}]},"type":"invalid_request_error","param":null,"code":null}`, in)
		}
		for _, m := range req.Messages {
			ids := []string{}
			if id, ok := m["tool_call_id"].(string); ok {
				ids = append(ids, id)
			}
			calls, _ := m["tool_calls"].([]any)
			for _, c := range calls {
				id, _ := c.(map[string]any)["id"].(string)
				ids = append(ids, id)
			}
			for _, id := range ids {
				if !mistralID(id) {
					return http.StatusBadRequest, fmt.Sprintf(`{"object":"error","message":"Tool call id was %s but must be a-z, A-Z, 0-9, with a length of 9.","type":"invalid_function_call","param":null,"code":"3280"}`, id)
				}
			}
		}
	case DeepSeek:
		// Thinking mode: an assistant message that called tools must bring
		// its reasoning_content back in every later request.
		for _, m := range req.Messages {
			if _, calls := m["tool_calls"]; !calls || m["role"] != "assistant" {
				continue
			}
			if _, ok := m["reasoning_content"].(string); !ok {
				return http.StatusBadRequest, `{"error":{"message":"The ` + "`reasoning_content`" + ` in the thinking mode must be passed back to the API.","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}`
			}
		}
	case Strict:
		for _, m := range req.Messages {
			calls, _ := m["tool_calls"].([]any)
			for _, c := range calls {
				fn, _ := c.(map[string]any)["function"].(map[string]any)
				args, _ := fn["arguments"].(string)
				var v map[string]any
				if json.Unmarshal([]byte(args), &v) != nil {
					return http.StatusBadRequest, `{"error":{"code":"invalid_parameter_error","param":null,"message":"<400> InternalError.Algo.InvalidParameter: The \"function.arguments\" parameter of the code model must be in JSON format.","type":"invalid_request_error"}}`
				}
			}
		}
	}
	return 0, ""
}

func mistralID(id string) bool {
	if len(id) != 9 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// splitWords cuts text into streamed pieces that keep their spaces.
func splitWords(text string) []string {
	var out []string
	for text != "" {
		i := strings.IndexByte(text[1:], ' ')
		if i < 0 {
			out = append(out, text)
			break
		}
		out = append(out, text[:i+1])
		text = text[i+1:]
	}
	return out
}
