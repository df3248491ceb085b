package turn

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// toolDescription is the python tool's description: the contract, short.
const toolDescription = "Run Python in your persistent workbench. Globals persist across calls; top-level await works; " +
	"the last expression is shown to you. print() and shown values are workbench output, never speech: speak with " +
	"`await local.send(text)`, which returns a receipt. `await runtime.wait(seconds=None, reason=...)` ends the cell " +
	"and your turn until input or the deadline."

// assemble builds the request's messages: the active release's prompt, then
// the context epoch's transcript, raw. It returns the estimated size in
// tokens (serialized bytes / 4): the caller refuses what does not fit the
// budget instead of truncating it.
func (r *runner) assemble(ctx context.Context, s store.Session, epoch int64) ([]provider.Message, int, error) {
	system, err := r.l.cfg.Prompt(ctx, s.PolicyRevision)
	if err != nil {
		return nil, 0, fmt.Errorf("prompt of release %s: %w", s.PolicyRevision, err)
	}
	items, err := r.l.cfg.Store.Context(ctx, r.session, epoch)
	if err != nil {
		return nil, 0, err
	}
	msgs := append([]provider.Message{{Role: "system", Content: system}}, Transcript(items)...)
	b, err := json.Marshal(msgs)
	if err != nil {
		return nil, 0, err
	}
	tools, _ := json.Marshal(provider.PythonTool(toolDescription))
	return msgs, (len(b) + len(tools) + 3) / 4, nil
}

// Transcript renders context items as chat messages. Every assistant
// message with tool calls is followed by one tool message per call, in call
// order, under the call's id: the results recorded for them, or an explicit
// "no result" when none was (the sequence stays valid for the provider
// whatever happened in between).
func Transcript(items []store.ContextItem) []provider.Message {
	results := map[string]string{}
	for _, it := range items {
		if it.Role == "tool" {
			results[it.CallID] = renderResult(it)
		}
	}
	answered := map[string]bool{}
	var out []provider.Message
	for _, it := range items {
		switch it.Role {
		case "input":
			out = append(out, provider.Message{Role: "user", Content: renderInput(it.Content)})
		case "notice":
			out = append(out, provider.Message{Role: "user", Content: renderNotice(it.Kind, it.Content)})
		case "assistant":
			var sp struct {
				Text  string           `json:"text"`
				Calls []store.StepCall `json:"tool_calls"`
			}
			if json.Unmarshal(it.Content, &sp) != nil {
				continue
			}
			m := provider.Message{Role: "assistant", Content: sp.Text}
			for _, c := range sp.Calls {
				m.ToolCalls = append(m.ToolCalls, provider.ToolCall{ID: c.ID, Type: "function",
					Function: provider.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
			}
			if m.Content == "" && len(m.ToolCalls) == 0 {
				continue
			}
			out = append(out, m)
			for _, c := range sp.Calls {
				res, ok := results[c.ID]
				if !ok {
					res = "status: interrupted\nNo result was recorded for this call; it may not have run."
				}
				answered[c.ID] = true
				out = append(out, provider.Message{Role: "tool", ToolCallID: c.ID, Content: res})
			}
		case "tool":
			// Placed right after its call above; an orphan result has no
			// call to answer and is left out.
		}
	}
	return out
}

func renderInput(content json.RawMessage) string {
	var in struct {
		Text         string `json:"text"`
		SourceKind   string `json:"source_kind"`
		Conversation string `json:"conversation"`
		Author       string `json:"author"`
	}
	if json.Unmarshal(content, &in) != nil {
		return string(content)
	}
	if in.SourceKind == "operator" {
		return in.Text
	}
	return fmt.Sprintf("[%s %s · %s] %s", in.SourceKind, in.Conversation, in.Author, in.Text)
}

func renderNotice(kind string, content json.RawMessage) string {
	var n map[string]any
	_ = json.Unmarshal(content, &n)
	str := func(k string) string { s, _ := n[k].(string); return s }
	switch kind {
	case "wait.woken":
		msg := fmt.Sprintf("[klbr] You woke: %s.", str("by"))
		if r := str("reason"); r != "" {
			msg += fmt.Sprintf(" You were waiting for: %s.", r)
		}
		if ms, ok := n["waited_ms"].(float64); ok && ms > 0 {
			msg += fmt.Sprintf(" You waited %.1f s.", ms/1000)
		}
		if m := str("message"); m != "" {
			msg += " " + m + "."
		}
		return msg
	case "delivery.reminder":
		return "[klbr] " + str("text")
	case "turn.resumed":
		return "[klbr] " + str("reason") + ". Check what state your work is in before you go on."
	}
	return fmt.Sprintf("[klbr %s] %s", kind, content)
}

// renderResult renders a tool result: a cell's outcome or an unrun call.
func renderResult(it store.ContextItem) string {
	if it.Kind == "tool.unrun" {
		var u struct {
			State   string `json:"state"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(it.Content, &u)
		return fmt.Sprintf("status: %s\n%s", u.State, u.Message)
	}
	var o worker.Outcome
	if json.Unmarshal(it.Content, &o) != nil {
		return string(it.Content)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s\n", o.Status)
	for _, c := range o.Output.Preview {
		if c.Origin == "task" {
			fmt.Fprintf(&b, "[task %s %s] ", c.Task, c.Stream)
		} else if c.Stream == "stderr" {
			b.WriteString("[stderr] ")
		}
		b.WriteString(c.Data)
		if !strings.HasSuffix(c.Data, "\n") {
			b.WriteByte('\n')
		}
	}
	if o.Output.OmittedBytes > 0 {
		fmt.Fprintf(&b, "[%d more bytes of output", o.Output.OmittedBytes)
		if o.Output.Artifact != nil {
			fmt.Fprintf(&b, " in artifact %s", o.Output.Artifact.SHA256)
		}
		b.WriteString("]\n")
	}
	if o.Value != nil {
		fmt.Fprintf(&b, "value: %s\n", *o.Value)
	}
	if o.Error != nil {
		fmt.Fprintf(&b, "error: %s: %s\n", o.Error.Type, o.Error.Message)
		if o.Error.Traceback != "" {
			b.WriteString(o.Error.Traceback)
		}
	}
	if o.Reset {
		b.WriteString("The workbench was reset: its globals are gone.\n")
	}
	if o.Status == "yielded" {
		b.WriteString("You are waiting; code after runtime.wait did not run.\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
