package history

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

func raw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }

// "Not said versus said", in what the summarizer reads: a scratchpad that
// claims a send is labelled tentative, and the send carries its receipt;
// operator requests and Discord observations are told apart, with authors.
func TestRenderSourceKeepsLanesAndReceipts(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	src := []store.SourceEntry{
		{Role: "input", EventRef: "e1", At: at, Content: raw(map[string]any{"text": "tell bob the build is green", "source_kind": "operator"})},
		{Role: "input", EventRef: "e2", At: at, Content: raw(map[string]any{"text": "is it green?", "source_kind": "discord", "author": "bob", "conversation": "123"})},
		{Role: "assistant", EventRef: "e3", At: at, Content: raw(map[string]any{"text": "I sent bob the news.",
			"tool_calls": []map[string]any{{"id": "c1", "name": "python", "arguments": `{"code":"await discord.conversation('d1').send('green')"}`}}})},
		{Role: "tool", EventRef: "e4", At: at, Content: raw(map[string]any{"tool_call_id": "c1", "status": "ok", "output": map[string]any{"preview": []any{}}}),
			Sends: []store.SendReceipt{{Channel: "discord:123 (d1)", Text: "green", State: "failed", Detail: "Missing Access"}}},
		{Summary: &store.Summary{ID: 4, Kind: "normal", Items: 9, Depth: 1, Text: "earlier: nothing sent"}, At: at},
	}
	text, depth := RenderSource(src)
	for _, want := range []string{
		"[operator request · 2026-12-01 09:00Z · e1]\ntell bob the build is green",
		"[external observation · bob in 123 · 2026-12-01 09:00Z · e2]",
		"[scratchpad: the agent's tentative thought, not delivered to anyone · e3]\nI sent bob the news.",
		"[python cell c1: code the agent ran]\nawait discord.conversation('d1').send('green')",
		"[send to discord:123 (d1) from that cell · receipt: failed (NOT delivered): Missing Access]\ngreen",
		"[earlier summary s4 · normal · covers 9 records",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("source lacks %q:\n%s", want, text)
		}
	}
	if depth != 2 {
		t.Errorf("depth %d, want 2", depth)
	}
	stub := Stub(src, []string{"attempt 2: no answer within 2m0s"})
	if !strings.Contains(stub, "no answer within") || !strings.Contains(stub, "2 inputs") || !strings.Contains(stub, "history.children") ||
		strings.Contains(stub, "sent bob") {
		t.Errorf("stub: %s", stub)
	}
}
