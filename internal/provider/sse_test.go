package provider

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
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
		for _, tc := range resp.ToolCalls {
			if tc.ID == "" || tc.Function.Name == "" {
				t.Fatalf("tool call without id or name: %+v", tc)
			}
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
