package turn

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

func item(id int64, role, kind, call string, content any) store.Entry {
	b, _ := json.Marshal(content)
	return store.Entry{Position: id, Item: &store.ContextItem{ID: id, Role: role, Kind: kind, CallID: call, Content: b}}
}

// Every call is answered right after its assistant message, in call order,
// whatever order the results were recorded in; a call without a result is
// answered as interrupted; an orphan result is left out. Built item by item
// or at once, the transcript is the same.
func TestTranscriptKeepsToolGroupsValid(t *testing.T) {
	items := []store.Entry{
		item(1, "input", "operator.input", "", map[string]string{"text": "hi", "source_kind": "operator"}),
		item(2, "assistant", "scratchpad", "", map[string]any{"text": "two calls", "tool_calls": []map[string]string{
			{"id": "a", "name": "python", "arguments": `{"code":"1"}`}, {"id": "b", "name": "python", "arguments": `{"code":"2"}`}}}),
		item(3, "tool", "tool.unrun", "b", map[string]string{"state": "skipped", "message": "not run"}),
		item(4, "tool", "cell.finished", "a", map[string]any{"status": "ok", "value": "1", "output": map[string]any{"preview": []any{}}}),
		item(5, "tool", "tool.unrun", "zzz", map[string]string{"state": "interrupted", "message": "orphan"}),
		item(6, "assistant", "scratchpad", "", map[string]any{"text": "", "tool_calls": []map[string]string{{"id": "c", "name": "python", "arguments": `{}`}}}),
		item(7, "notice", "wait.woken", "", map[string]any{"by": "input", "reason": "r"}),
	}
	whole := newTranscript(0, 0)
	for _, it := range items {
		whole.add(it)
	}
	msgs := whole.msgs
	var got []string
	for _, m := range msgs {
		got = append(got, m.Role+":"+m.ToolCallID)
	}
	if want := "user: assistant: tool:a tool:b assistant: tool:c user:"; strings.Join(got, " ") != want {
		t.Fatalf("got %s\nwant %s", strings.Join(got, " "), want)
	}
	if !strings.Contains(msgs[2].Content, "value: 1") || !strings.Contains(msgs[3].Content, "status: skipped") ||
		!strings.Contains(msgs[5].Content, "No result was recorded") || !strings.Contains(msgs[6].Content, "You woke: input") {
		t.Fatalf("contents: %+v", msgs)
	}
	// Incrementally, in two parts, with the second result arriving late.
	tr := newTranscript(0, 0)
	for _, it := range items[:3] {
		tr.add(it)
	}
	for _, it := range items[3:] {
		tr.add(it)
	}
	full, _ := json.Marshal(msgs)
	inc, _ := json.Marshal(tr.msgs)
	if string(full) != string(inc) {
		t.Fatalf("incremental differs:\n%s\n%s", full, inc)
	}
	if sum := len(inc); tr.bytes < sum-2 || tr.bytes > sum+len(msgs) {
		t.Fatalf("size %d for %d bytes", tr.bytes, sum)
	}
}

func TestParseCall(t *testing.T) {
	for _, tc := range []struct{ name, args, problem string }{
		{"python", `{"code":"x = 1"}`, ""},
		{"python", `{"code": 1}`, "code must be a string"},
		{"python", `{"code":"x", "more": 1}`, "exactly one argument"},
		{"python", `not json`, "not a JSON object"},
		{"python", `{"code":"  "}`, "code is empty"},
		{"shell", `{"code":"ls"}`, "there is no tool"},
	} {
		c := providerCall(tc.name, tc.args)
		_, problem := parseCall(c)
		if (tc.problem == "") != (problem == "") || !strings.Contains(problem, tc.problem) {
			t.Errorf("%s %s: problem %q, want %q", tc.name, tc.args, problem, tc.problem)
		}
	}
}

func providerCall(name, args string) provider.ToolCall {
	return provider.ToolCall{ID: "x", Type: "function", Function: provider.FunctionCall{Name: name, Arguments: args}}
}

// A burst is taken in frames of at most MaxFrameInputs, in the plan's
// order (operator input first, then conversations taking turns).
func TestPlanBoundsAFrame(t *testing.T) {
	now := time.Now()
	var pending []store.PendingInput
	for i := range 100 {
		conv := "busy"
		if i%10 == 0 {
			conv = "quiet"
		}
		pending = append(pending, store.PendingInput{ID: int64(i + 1), SourceKind: "discord", Conversation: conv,
			ReceivedAt: now.Add(-time.Minute + time.Duration(i)*time.Millisecond)})
	}
	pending = append(pending, store.PendingInput{ID: 500, SourceKind: "operator", Directed: true, Conversation: "operator", ReceivedAt: now})
	r := &runner{l: New(Config{}), deferred: map[int64]time.Time{}}
	ready, _ := r.plan(t.Context(), nil, pending, now)
	if len(ready) != MaxFrameInputs {
		t.Fatalf("%d inputs in a frame, want %d", len(ready), MaxFrameInputs)
	}
	if ready[0].ID != 500 || ready[1].Conversation != "quiet" || ready[2].Conversation != "busy" || ready[3].Conversation != "quiet" {
		t.Fatalf("order: %d %s %s %s", ready[0].ID, ready[1].Conversation, ready[2].Conversation, ready[3].Conversation)
	}
}
