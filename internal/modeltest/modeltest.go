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
}

// Request is a request the server received.
type Request struct {
	Messages []map[string]any
	Tools    []any
	Stream   bool
	Body     map[string]any
}

// Server plays a script.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	script   []Reply
	fallback func(n int) Reply
	requests []Request
	arrived  chan struct{}
}

// New starts a server. Close it with Close (tests: t.Cleanup(s.Close)).
func New() *Server {
	s := &Server{arrived: make(chan struct{}, 1024)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the route's base URL (…/v1).
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// Close stops the server.
func (s *Server) Close() { s.srv.CloseClientConnections(); s.srv.Close() }

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
	s.requests = append(s.requests, req)
	n := len(s.requests)
	var reply Reply
	var ok bool
	if len(s.script) > 0 {
		reply, s.script, ok = s.script[0], s.script[1:], true
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
	play(w, r, reply, req.Stream, n)
}

func play(w http.ResponseWriter, r *http.Request, reply Reply, stream bool, n int) {
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
			msg["reasoning_content"] = reply.Reasoning
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
	if reply.Reasoning != "" {
		chunk(map[string]any{"reasoning_content": reply.Reasoning}, nil)
	}
	words := splitWords(reply.Text)
	for i, wd := range words {
		if reply.Hold != nil && i == reply.HoldAfter {
			select {
			case <-reply.Hold:
			case <-r.Context().Done():
				return
			}
		}
		chunk(map[string]any{"content": wd}, nil)
	}
	if reply.Hold != nil && len(words) <= reply.HoldAfter {
		select {
		case <-reply.Hold:
		case <-r.Context().Done():
			return
		}
	}
	for i, c := range calls {
		fn := c["function"].(map[string]any)
		args := fn["arguments"].(string)
		half := len(args) / 2
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
	chunk(map[string]any{}, finish)
	if reply.Usage != nil {
		b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("cmpl-%d", n), "object": "chat.completion.chunk", "choices": []any{}, "usage": reply.Usage})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	io.WriteString(w, "data: [DONE]\n\n")
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
