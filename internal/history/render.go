package history

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/outside"
	"github.com/klbr-dev/klbr/internal/store"
)

// DefaultPrompt is the summary prompt when the release has none
// (behavior/prompts/summary.md is the editable one).
const DefaultPrompt = `You are compacting part of an agent's history so that it still fits its context window.
Write a faithful, dense summary of the records below. The originals stay retrievable by their refs; your summary replaces them in the agent's context.

Keep apart, and label:
- what the operator asked or said (operator requests), and what others said in Discord (external observations), with who said it and where;
- the agent's scratchpad: tentative internal thought, never a statement that something happened;
- sends: a send the agent proposed or attempted is not a delivery. Say "delivered" only where the record's receipt says confirmed; say failed, held, pending or unknown exactly where it says so;
- corrections, decisions, unresolved questions and commitments;
- paths, commands and their results, artifact ids and refs (e123, s4, a<sha256>) worth reading again;
- uncertainty: what is not known.

Do not invent records, refs or outcomes. Pending work and delivery state are read from records, not from this summary. Answer with the summary text only.`

// RenderSource renders a run for the summarizer: each record with its lane,
// source and ref, each send with its receipt. It returns the text and the
// run's depth (1 + its deepest summary).
func RenderSource(src []store.SourceEntry) (string, int) {
	var b strings.Builder
	depth := 1
	for _, e := range src {
		if e.Summary != nil {
			s := e.Summary
			depth = max(depth, s.Depth+1)
			fmt.Fprintf(&b, "[earlier summary %s · %s · covers %d records · %s]\n%s\n\n", store.SummaryRef(s.ID), s.Kind, s.Items,
				when(s.CreatedAt), s.Text)
			continue
		}
		var m map[string]any
		_ = json.Unmarshal(e.Content, &m)
		str := func(k string) string { s, _ := m[k].(string); return s }
		switch e.Role {
		case "input":
			who := str("author")
			if str("source_kind") == "operator" {
				fmt.Fprintf(&b, "[operator request · %s · %s]\n%s\n\n", when(e.At), e.EventRef, str("text"))
			} else {
				fmt.Fprintf(&b, "[external observation · %s in %s · %s · %s]\n%s\n\n", outside.Name(who), outside.Name(str("conversation")),
					when(e.At), e.EventRef, outside.Block(str("text")))
			}
		case "assistant":
			if t := strings.TrimSpace(str("text")); t != "" {
				fmt.Fprintf(&b, "[scratchpad: the agent's tentative thought, not delivered to anyone · %s]\n%s\n\n", e.EventRef, t)
			}
			calls, _ := m["tool_calls"].([]any)
			for _, c := range calls {
				cm, _ := c.(map[string]any)
				id, _ := cm["id"].(string)
				args, _ := cm["arguments"].(string)
				var a struct {
					Code string `json:"code"`
				}
				code := args
				if json.Unmarshal([]byte(args), &a) == nil && a.Code != "" {
					code = a.Code
				}
				fmt.Fprintf(&b, "[python cell %s: code the agent ran]\n%s\n\n", id, code)
			}
		case "tool":
			fmt.Fprintf(&b, "[cell result %s · %s]\n%s\n\n", str("tool_call_id"), e.EventRef, outside.Block(cellResult(m)))
			for _, s := range e.Sends {
				fmt.Fprintf(&b, "[send to %s from that cell · receipt: %s%s]\n%s\n\n", s.Channel, receipt(s.State), detail(s), s.Text)
			}
		case "notice":
			fmt.Fprintf(&b, "[klbr notice %s · %s]\n%s\n\n", e.Kind, e.EventRef, compactJSON(e.Content))
		}
	}
	return strings.TrimRight(b.String(), "\n"), depth
}

func receipt(state string) string {
	switch state {
	case "confirmed":
		return "confirmed (delivered)"
	case "held":
		return "held by review (NOT delivered)"
	case "failed":
		return "failed (NOT delivered)"
	case "unknown":
		return "unknown (delivery not confirmed)"
	case "pending", "attempting":
		return state + " (not yet delivered)"
	}
	return state
}

func detail(s store.SendReceipt) string {
	out := ""
	if s.Detail != "" {
		out += ": " + s.Detail
	}
	if s.Ref != "" {
		out += " · " + s.Ref
	}
	return out
}

// cellResult renders a cell outcome's status, output preview, value and
// error, as the model saw them.
func cellResult(m map[string]any) string {
	var b strings.Builder
	if st, ok := m["state"].(string); ok && m["message"] != nil {
		msg, _ := m["message"].(string)
		return "status: " + st + "\n" + msg
	}
	status, _ := m["status"].(string)
	fmt.Fprintf(&b, "status: %s\n", status)
	if out, ok := m["output"].(map[string]any); ok {
		chunks, _ := out["preview"].([]any)
		for _, c := range chunks {
			cm, _ := c.(map[string]any)
			d, _ := cm["data"].(string)
			b.WriteString(d)
		}
		if n, _ := out["omitted_bytes"].(float64); n > 0 {
			fmt.Fprintf(&b, "\n[%d more bytes of output", int64(n))
			if a, ok := out["artifact"].(map[string]any); ok {
				sha, _ := a["sha256"].(string)
				fmt.Fprintf(&b, " in artifact a%s", sha)
			}
			b.WriteString("]")
		}
	}
	if v, ok := m["value"].(string); ok {
		fmt.Fprintf(&b, "\nvalue: %s", v)
	}
	if e, ok := m["error"].(map[string]any); ok {
		t, _ := e["type"].(string)
		msg, _ := e["message"].(string)
		fmt.Fprintf(&b, "\nerror: %s: %s", t, msg)
	}
	return strings.TrimSpace(b.String())
}

func compactJSON(raw json.RawMessage) string {
	if len(raw) > 400 {
		return string(raw[:400]) + "…"
	}
	return string(raw)
}

func when(t time.Time) string { return t.UTC().Format("2006-01-02 15:04Z") }

// Stub is the degraded summary the host writes when the summarizer cannot
// be used: what the run covers and how to read it, nothing invented.
func Stub(src []store.SourceEntry, problems []string) string {
	counts := map[string]int{}
	var first, last time.Time
	var refs []string
	for _, e := range src {
		k := e.Role
		if e.Summary != nil {
			k = "earlier summaries"
		}
		counts[k]++
		if first.IsZero() || e.At.Before(first) {
			first = e.At
		}
		if e.At.After(last) {
			last = e.At
		}
		if len(refs) < 3 {
			if e.Summary != nil {
				refs = append(refs, store.SummaryRef(e.Summary.ID))
			} else {
				refs = append(refs, e.EventRef)
			}
		}
	}
	var parts []string
	for _, k := range []string{"input", "assistant", "tool", "notice", "earlier summaries"} {
		if counts[k] > 0 {
			name := map[string]string{"input": "inputs", "assistant": "scratchpad steps", "tool": "cell results", "notice": "notices"}[k]
			if name == "" {
				name = k
			}
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], name))
		}
	}
	why := "the summarizer could not be used"
	if len(problems) > 0 {
		why = problems[len(problems)-1]
	}
	return fmt.Sprintf("No summary of these records could be written (%s). They cover %s, from %s to %s, starting at %s. "+
		"Nothing in them is summarized here: read them with `await history.children(ref)` on this summary's ref and "+
		"`await history.read(ref)`.", why, strings.Join(parts, ", "), when(first), when(last), strings.Join(refs, ", "))
}

// Frame renders a summary entry as the model sees it in its context.
func Frame(s store.Summary) string {
	return fmt.Sprintf("[klbr summary %s · %s · replaces %d earlier records of this context; read them with "+
		"`await history.children(%q)`]\n%s", store.SummaryRef(s.ID), s.Kind, s.Items, store.SummaryRef(s.ID), s.Text)
}
