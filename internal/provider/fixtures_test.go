package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

// want is what a stream fixture must read as (testdata/streams/*.want).
type want struct {
	Content          string          `json:"content"`
	Reasoning        string          `json:"reasoning"`
	ReasoningField   string          `json:"reasoning_field"`
	ReasoningDetails json.RawMessage `json:"reasoning_details"`
	Calls            []struct {
		ID        string `json:"id"` // "*": made up (nine alphanumerics)
		SentID    string `json:"sent_id"`
		MadeUp    bool   `json:"made_up"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"calls"`
	Incomplete int            `json:"incomplete"`
	Finish     string         `json:"finish"`
	Usage      map[string]int `json:"usage"` // prompt, completion, total, cache_read, cache_write, cache_miss
	Error      *struct {
		Kind, Contains string
		Retryable      bool
	} `json:"error"`
}

// fixtureServer serves a recorded stream, cut into writes by split, each
// flushed on its own.
func fixtureServer(t *testing.T, body []byte, split func([]byte) [][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, part := range split(body) {
			w.Write(part)
			fl.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// byEvent cuts a stream after each blank line: one event per write.
func byEvent(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.Index(b, []byte("\n\n"))
		j := bytes.Index(b, []byte("\r\n\r\n"))
		n := len(b)
		switch {
		case i >= 0 && (j < 0 || i < j):
			n = i + 2
		case j >= 0:
			n = j + 4
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// bySeven cuts a stream into 7-byte writes.
func bySeven(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 7 {
		out = append(out, b[:7])
		b = b[7:]
	}
	return append(out, b)
}

// TestStreamFixtures plays every recorded-format stream twice, one event per
// write and in 7-byte writes, through a real HTTP connection, and checks
// what the client reads.
func TestStreamFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/streams/*.sse")
	if err != nil || len(files) < 20 {
		t.Fatalf("fixtures: %d, %v", len(files), err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".sse")
		body, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		wb, err := os.ReadFile(strings.TrimSuffix(file, ".sse") + ".want")
		if err != nil {
			t.Fatal(err)
		}
		var w want
		dec := json.NewDecoder(bytes.NewReader(wb))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&w); err != nil {
			t.Fatalf("%s.want: %v", name, err)
		}
		for _, mode := range []struct {
			name  string
			split func([]byte) [][]byte
		}{{"events", byEvent}, {"7-byte", bySeven}} {
			t.Run(name+"/"+mode.name, func(t *testing.T) {
				srv := fixtureServer(t, body, mode.split)
				c, err := New(config.Route{URL: srv.URL + "/v1", Model: "m", TimeoutSeconds: 30}, Options{})
				if err != nil {
					t.Fatal(err)
				}
				var streamed strings.Builder
				resp, err := c.Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true,
					OnDelta: func(d Delta) { streamed.WriteString(d.Content) }})
				checkWant(t, w, resp, err)
				if resp != nil && streamed.String() != resp.Content {
					t.Errorf("deltas %q, content %q", streamed.String(), resp.Content)
				}
			})
		}
	}
}

func checkWant(t *testing.T, w want, resp *Response, err error) {
	t.Helper()
	if w.Error != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v, want a %s error", err, w.Error.Kind)
		}
		if e.Kind.String() != w.Error.Kind || e.Retryable() != w.Error.Retryable || !strings.Contains(err.Error(), w.Error.Contains) {
			t.Errorf("error %v: kind %s retryable %v, want %s %v containing %q", err, e.Kind, e.Retryable(), w.Error.Kind, w.Error.Retryable, w.Error.Contains)
		}
		if resp != nil && resp.ToolCalls != nil {
			t.Errorf("tool calls with an error: %+v", resp.ToolCalls)
		}
	} else if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp == nil {
		t.Fatal("no response")
	}
	if resp.Content != w.Content || resp.Reasoning != w.Reasoning || resp.ReasoningField != w.ReasoningField || resp.FinishReason != w.Finish {
		t.Errorf("content %q reasoning %q (%s) finish %q\nwant    %q reasoning %q (%s) finish %q",
			resp.Content, resp.Reasoning, resp.ReasoningField, resp.FinishReason, w.Content, w.Reasoning, w.ReasoningField, w.Finish)
	}
	if len(w.ReasoningDetails) > 0 || len(resp.ReasoningDetails) > 0 {
		var got, exp any
		_ = json.Unmarshal(resp.ReasoningDetails, &got)
		_ = json.Unmarshal(w.ReasoningDetails, &exp)
		if fmt.Sprint(got) != fmt.Sprint(exp) {
			t.Errorf("reasoning_details %s\nwant %s", resp.ReasoningDetails, w.ReasoningDetails)
		}
	}
	if len(resp.ToolCalls) != len(w.Calls) {
		t.Fatalf("%d calls %+v, want %d", len(resp.ToolCalls), resp.ToolCalls, len(w.Calls))
	}
	for i, c := range resp.ToolCalls {
		wc := w.Calls[i]
		idOK := c.ID == wc.ID || (wc.ID == "*" && len(c.ID) == 9 && isAlnum(c.ID))
		sent, madeUp := resp.MadeUpIDs[c.ID]
		if !idOK || sent != wc.SentID || madeUp != wc.MadeUp || c.Function.Name != wc.Name || c.Function.Arguments != wc.Arguments || c.Type != "function" {
			t.Errorf("call %d: %+v, want %+v", i, c, wc)
		}
	}
	if len(resp.Incomplete) != w.Incomplete {
		t.Errorf("%d incomplete calls, want %d", len(resp.Incomplete), w.Incomplete)
	}
	got := map[string]int{}
	for k, p := range map[string]*int{"prompt": resp.Usage.PromptTokens, "completion": resp.Usage.CompletionTokens, "total": resp.Usage.TotalTokens,
		"cache_read": resp.Usage.CacheReadTokens, "cache_write": resp.Usage.CacheWriteTokens, "cache_miss": resp.Usage.CacheMissTokens} {
		if p != nil {
			got[k] = *p
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(w.Usage) && !(len(got) == 0 && len(w.Usage) == 0) {
		t.Errorf("usage %v, want %v", got, w.Usage)
	}
}
