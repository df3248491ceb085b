package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/store"
)

func rec(lane store.Lane, kind string, content any) store.Record {
	b, _ := json.Marshal(content)
	return store.Record{Seq: 7, Lane: lane, Kind: kind, At: time.Unix(0, 0), Content: b}
}

// The human tail shows each lane as a person reads it: scratchpad text with
// its tool calls' code, a cell's code and outcome, an unrun call's reason,
// a held send's reason; a partial scratchpad says it never ran.
func TestTailDescribesRecords(t *testing.T) {
	for _, tc := range []struct {
		r    store.Record
		want []string
	}{
		{rec(store.LaneScratchpad, "scratchpad", map[string]any{"text": "Let me look.", "partial": false,
			"tool_calls": []map[string]string{{"id": "c1", "name": "python", "arguments": `{"code":"x = 1\nx"}`}}}),
			[]string{"Let me look.", "→ python c1:", "x = 1", "x"}},
		{rec(store.LaneScratchpad, "scratchpad", map[string]any{"text": "half", "partial": true, "tool_calls": []any{}}),
			[]string{"[partial: cut off, never run] half"}},
		// A traced attempt's steps name its trace, so the operator can open it.
		{rec(store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 12, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
			"text": "Let me look.", "tool_calls": []any{}}),
			[]string{"[attempt 12 trace 4bf92f3577b34da6a3ce929d0e0e4736] Let me look."}},
		{rec(store.LaneCell, "cell.started", map[string]any{"code": "print(1)"}), []string{"print(1)"}},
		{rec(store.LaneCell, "cell.finished", map[string]any{"status": "error", "output": map[string]any{"preview": []map[string]string{{"data": "out\n"}}},
			"error": map[string]string{"type": "ValueError", "message": "bad"}}), []string{"error", "out", "ValueError: bad"}},
		{rec(store.LaneCell, "tool.unrun", map[string]any{"state": "invalid", "message": "not run: code must be a string"}),
			[]string{"invalid: not run: code must be a string"}},
		{rec(store.LaneSpeech, "local.held", map[string]any{"text": "hi", "status": "held", "reason": "policy"}), []string{"hi [held: policy]"}},
		{rec(store.LaneNotice, "wait.started", map[string]any{"seconds": 60, "reason": "r"}), []string{`"seconds":60`}},
		// A record retention collected says so, never as empty text.
		{collectedRec(), []string{"e9 ", "[collected by retention on 2026-01-02: retention.history_days = 90: test]"}},
		// A compaction: one measure, labelled as the compact command and the browser label it.
		{rec(store.LaneNotice, "context.compacted", map[string]any{"summary": "s4", "items": 14, "kind": "normal", "reason": "threshold",
			"tokens_before": 9200, "tokens_after": 3100, "source_tokens": 6400, "summary_tokens": 300, "route": "main"}),
			[]string{"summary s4 (normal, threshold) covers 14 records; " + history.Measure(9200, 3100)}},
	} {
		var b bytes.Buffer
		if err := printRecord(&b, tc.r); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: %q lacks %q", tc.r.Kind, b.String(), w)
			}
		}
		if tc.r.Kind == "context.compacted" && (strings.Contains(b.String(), "6400") || strings.Contains(b.String(), "300 ")) {
			t.Errorf("the compaction's line shows a second measure: %q", b.String())
		}
	}
}

func collectedRec() store.Record {
	r := rec(store.LaneScratchpad, "scratchpad", map[string]any{"collected": map[string]any{"at": 1, "reason": "x"}})
	r.ID = 9
	r.Collected = &store.Collection{At: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC), Reason: "retention.history_days = 90: test", Bytes: 10}
	return r
}
