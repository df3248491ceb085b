package turn

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
)

// randomHistory is a random active context: inputs, notices, assistant
// messages with calls whose results arrive later (sometimes after other
// entries, sometimes never), and earlier summaries.
func randomHistory(rng *rand.Rand, n int) []store.Entry {
	var out []store.Entry
	var open []string
	id := int64(0)
	next := func() int64 { id++; return id }
	for len(out) < n {
		switch k := rng.IntN(10); {
		case k < 2:
			p := next()
			out = append(out, item(p, "input", "operator.input", "", map[string]string{"text": "hi", "source_kind": "operator"}))
		case k < 3:
			p := next()
			out = append(out, store.Entry{Position: p, Summary: &store.Summary{ID: p, Kind: "normal", Items: 3, Text: "earlier"}})
		case k < 6:
			p := next()
			var calls []map[string]string
			for range rng.IntN(3) + 1 {
				c := fmt.Sprintf("c%d-%d", p, len(calls))
				calls = append(calls, map[string]string{"id": c, "name": "python", "arguments": `{"code":"1"}`})
				open = append(open, c)
			}
			out = append(out, item(p, "assistant", "scratchpad", "", map[string]any{"text": "t", "tool_calls": calls}))
		case k < 9 && len(open) > 0:
			i := rng.IntN(len(open))
			c := open[i]
			open = append(open[:i], open[i+1:]...)
			out = append(out, item(next(), "tool", "cell.finished", c, map[string]any{"status": "ok", "output": map[string]any{"preview": []any{}}}))
		default:
			out = append(out, item(next(), "notice", "wait.woken", "", map[string]any{"by": "input"}))
		}
	}
	return out
}

// Over random histories: the transcript is always a valid sequence for the
// provider (every call answered right after its message, under its id),
// and units never split a call from its result: a unit marked complete
// holds the answer of every call it opens.
func TestTranscriptAndUnitsOverRandomHistories(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		entries := randomHistory(rng, 5+rng.IntN(60))
		tr := newTranscript(0, 0)
		for _, e := range entries {
			tr.add(e)
		}
		msgs := tr.msgs
		for i := 0; i < len(msgs); i++ {
			if msgs[i].Role == "tool" {
				t.Fatalf("seed %d: a tool message at %d that no call asked for", seed, i)
			}
			for _, c := range msgs[i].ToolCalls {
				i++
				if i >= len(msgs) || msgs[i].Role != "tool" || msgs[i].ToolCallID != c.ID {
					t.Fatalf("seed %d: call %s is not answered right after its message", seed, c.ID)
				}
			}
		}
		units, complete := tr.units(func(b int) int { return b / 4 }, nil)
		byPos := map[int64]store.Entry{}
		for _, e := range entries {
			byPos[e.Position] = e
		}
		seen := 0
		for ui, u := range units {
			opened, answered := map[string]bool{}, map[string]bool{}
			for _, r := range u.Refs {
				seen++
				te := tr.entries[seen-1]
				if te.ref != r {
					t.Fatalf("seed %d: units out of order", seed)
				}
				for _, c := range te.opens {
					opened[c] = true
				}
				if te.answers != "" {
					answered[te.answers] = true
				}
			}
			if complete[ui] {
				for c := range opened {
					if !answered[c] {
						t.Fatalf("seed %d: unit %d is complete but call %s is answered outside it", seed, ui, c)
					}
				}
			}
		}
		if seen != len(entries) {
			t.Fatalf("seed %d: units cover %d of %d entries", seed, seen, len(entries))
		}
	}
}
