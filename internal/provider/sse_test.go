package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

func decodeAll(t testing.TB, in string, max int) ([]sseEvent, error) {
	d := newSSEDecoder(strings.NewReader(in), max)
	var evs []sseEvent
	for {
		ev, err := d.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestSSEDecoder(t *testing.T) {
	in := ": comment\r\n" +
		"event: message\r\ndata: a\r\ndata:b\r\nid: 1\r\nretry: 5\r\n\r\n" +
		"\n\n" +
		"data: {\"x\":1}\n\n" +
		"data: pending-cut"
	evs, err := decodeAll(t, in, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Event != "message" || string(evs[0].Data) != "a\nb" || evs[1].Event != "" || string(evs[1].Data) != `{"x":1}` {
		t.Errorf("%q", evs)
	}
	// [DONE] without its blank line at EOF is still dispatched.
	evs, err = decodeAll(t, "data: [DONE]", 100)
	if err != nil || len(evs) != 1 || string(evs[0].Data) != "[DONE]" {
		t.Errorf("%q %v", evs, err)
	}
	// A line at the bound passes; one byte more is an error, as is event
	// data that grows past the bound over several lines.
	if _, err := decodeAll(t, "data: "+strings.Repeat("x", 94)+"\n\n", 100); err != nil {
		t.Errorf("line at the bound: %v", err)
	}
	if _, err := decodeAll(t, "data: "+strings.Repeat("x", 95)+"\n\n", 100); !errors.Is(err, errSSELineTooLong) {
		t.Errorf("line over the bound: %v", err)
	}
	if _, err := decodeAll(t, strings.Repeat("data: "+strings.Repeat("x", 40)+"\n", 3)+"\n", 100); !errors.Is(err, errSSELineTooLong) {
		t.Errorf("event over the bound: %v", err)
	}
}

// FuzzSSE checks that the decoder and the stream reader never panic, never
// return an event over the bound, and never return a tool call as complete
// from a stream that failed.
func FuzzSSE(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"python\",\"arguments\":\"{\\\"co\"}}]}}]}\n\n"))
	f.Add([]byte(": ping\r\nevent: error\r\ndata: {}\r\n\r\n"))
	files, _ := filepath.Glob("testdata/streams/*.sse")
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	const max = 256
	f.Fuzz(func(t *testing.T, in []byte) {
		d := newSSEDecoder(bytes.NewReader(in), max)
		for i := 0; ; i++ {
			ev, err := d.Next()
			if err != nil {
				break
			}
			if len(ev.Data) > max {
				t.Fatalf("event of %d bytes", len(ev.Data))
			}
			if i > len(in) {
				t.Fatal("more events than input bytes")
			}
		}
		c := &Client{maxLine: max, maxBody: DefaultMaxBody}
		resp, err := c.readStream(bytes.NewReader(in), func(Delta) {})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v is not an *Error", err, err)
			}
			if resp != nil && resp.ToolCalls != nil {
				t.Fatalf("tool calls with an error: %+v", resp.ToolCalls)
			}
			return
		}
		if resp.Incomplete != nil {
			t.Fatalf("incomplete calls without an error")
		}
		seen := map[string]bool{}
		for _, tc := range resp.ToolCalls {
			if tc.ID == "" || tc.Function.Name == "" || seen[tc.ID] {
				t.Fatalf("tool call without id or name, or a repeated id: %+v", resp.ToolCalls)
			}
			seen[tc.ID] = true
		}
	})
}

// FuzzJSONResponse checks the non-streaming reader and the error-body
// reader the same way.
func FuzzJSONResponse(f *testing.F) {
	f.Add([]byte(`{"choices":[{"index":0,"message":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"t"}]},{"type":"text","text":"x"}],"tool_calls":[{"id":"","function":{"name":"python","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`))
	f.Add([]byte(`{"object":"error","message":{"detail":[{"type":"extra_forbidden"}]},"type":"invalid_request_error","code":null}`))
	f.Add([]byte(`{"error":{"message":"m","code":400}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		msg, code, _ := parseErrorBody(in)
		_, _ = msg, code
		c := &Client{maxLine: 256, maxBody: 4096}
		resp, err := c.readJSON(bytes.NewReader(in))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v is not an *Error", err, err)
			}
			if resp != nil && resp.ToolCalls != nil {
				t.Fatalf("tool calls with an error")
			}
			return
		}
		seen := map[string]bool{}
		for _, tc := range resp.ToolCalls {
			if tc.ID == "" || tc.Function.Name == "" || seen[tc.ID] {
				t.Fatalf("bad calls %+v", resp.ToolCalls)
			}
			seen[tc.ID] = true
		}
	})
}

// FuzzReplay checks that whatever a transcript holds, what is sent is valid
// for the dialect: every call id valid and unique, every tool message
// answering a call, every arguments a JSON object.
func FuzzReplay(f *testing.F) {
	f.Add("call_1", `{"code":"1"}`, "call_1", "", 2, true)
	f.Add("", `{"code": 12`, "", "x", 0, false)
	f.Add("a\x00b", `[1]`, "zzz", "r", 1, true)
	f.Fuzz(func(t *testing.T, id, args, toolID, reasoning string, dialectN int, twice bool) {
		names := []string{config.DialectOpenAI, config.DialectDeepSeek, config.DialectMistral, config.DialectOpenRouter}
		d, _ := DialectOf(config.Route{Dialect: names[(dialectN%len(names)+len(names))%len(names)]})
		call := ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: "python", Arguments: args}}
		msgs := []Message{{Role: "user", Content: "u"}, {Role: "assistant", ToolCalls: []ToolCall{call}, Reasoning: &Reasoning{Text: reasoning}},
			{Role: "tool", ToolCallID: id, Content: "r"}}
		if twice {
			msgs = append(msgs, Message{Role: "assistant", ToolCalls: []ToolCall{call, call}}, Message{Role: "tool", ToolCallID: id},
				Message{Role: "tool", ToolCallID: toolID})
		}
		out := replay(d, msgs)
		if _, err := json.Marshal(out); err != nil {
			t.Fatalf("replay does not marshal: %v", err)
		}
		used := map[string]bool{}
		var open []string
		for _, m := range out {
			for _, c := range m.ToolCalls {
				if !validID(d.ToolCallIDs, c.ID) || used[c.ID] {
					t.Fatalf("replayed id %q invalid or repeated", c.ID)
				}
				used[c.ID] = true
				open = append(open, c.ID)
				if !isJSONObject(c.Function.Arguments) {
					t.Fatalf("replayed arguments %q", c.Function.Arguments)
				}
			}
			if m.Role == "tool" && !validID(d.ToolCallIDs, m.ToolCallID) {
				t.Fatalf("tool message id %q", m.ToolCallID)
			}
		}
		if msgs[1].ToolCalls[0].ID != id || msgs[1].ToolCalls[0].Function.Arguments != args {
			t.Fatal("replay changed the caller's messages")
		}
		// The first tool message answers the first call.
		if out[2].ToolCallID != out[1].ToolCalls[0].ID {
			t.Fatalf("tool message %q does not answer call %q", out[2].ToolCallID, out[1].ToolCalls[0].ID)
		}
	})
}

// BenchmarkSSEDecode measures decoding a realistic content stream, chunks and
// deltas included.
func BenchmarkSSEDecode(b *testing.B) {
	var buf bytes.Buffer
	for i := 0; i < 2000; i++ {
		buf.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"some words of text "},"finish_reason":null}]}` + "\n\n")
	}
	buf.WriteString(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	in := buf.Bytes()
	c := &Client{maxLine: DefaultMaxSSELine, maxBody: DefaultMaxBody}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.readStream(bytes.NewReader(in), nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSSEFrames measures the SSE framing alone.
func BenchmarkSSEFrames(b *testing.B) {
	in := bytes.Repeat([]byte("data: "+strings.Repeat("x", 200)+"\n\n"), 5000)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		d := newSSEDecoder(bytes.NewReader(in), DefaultMaxSSELine)
		for {
			if _, err := d.Next(); err != nil {
				break
			}
		}
	}
}

// BenchmarkSSEDecodeFixtures decodes the recorded-format streams of
// testdata/streams (every dialect, reasoning, typed parts, parallel calls)
// one after another, for the throughput of the paths beyond plain content.
func BenchmarkSSEDecodeFixtures(b *testing.B) {
	files, _ := filepath.Glob("testdata/streams/*.sse")
	var ins [][]byte
	var total int64
	for _, f := range files {
		in, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		ins = append(ins, in)
		total += int64(len(in))
	}
	c := &Client{maxLine: DefaultMaxSSELine, maxBody: DefaultMaxBody}
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		for _, in := range ins {
			c.readStream(bytes.NewReader(in), nil)
		}
	}
}
