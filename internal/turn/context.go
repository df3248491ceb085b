package turn

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/outside"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// toolDescription is the python tool's description: the contract, short.
const toolDescription = "Run Python in your persistent workbench. Globals persist across calls; top-level await works; " +
	"the last expression is shown to you. print() and shown values are workbench output, never speech: speak with " +
	"`await local.send(text)`, which returns a receipt. `await runtime.wait(seconds=None, reason=...)` ends the cell " +
	"and your turn until input or the deadline."

// assemble builds the request's messages: the active release's prompt and
// the skill index the transcript began with, then the epoch's active
// context (originals and summaries, in order). It returns the request's
// size in bytes as sent (messages and tool schema): the caller estimates
// tokens from it and compacts or refuses what does not fit, never
// truncating. The transcript is kept between steps and extended with the
// entries added since; a compaction (a new context version) rebuilds it.
//
// Nothing before the newest entries changes from one request to the next,
// so that a provider's prompt cache serves the prefix: a maintenance goal
// brings the maintenance skill right after it, a changed skill index comes
// after the history as a message of its own, a result that arrives for a
// call already sent unanswered comes after the history too.
func (r *runner) assemble(ctx context.Context, s store.Session, epoch int64) ([]provider.Message, int, error) {
	system, err := r.l.cfg.Prompt(ctx, s.PolicyRevision)
	if err != nil {
		return nil, 0, fmt.Errorf("prompt of release %s: %w", s.PolicyRevision, err)
	}
	index := ""
	if r.l.cfg.Index != nil {
		index = r.l.cfg.Index(s.PolicyRevision)
	}
	t := r.transcript
	after := int64(0)
	if t != nil && t.epoch == epoch {
		after = t.last
	}
	ac, err := r.l.cfg.Store.Active(ctx, r.session, epoch, after)
	if err != nil {
		return nil, 0, err
	}
	if t == nil || t.epoch != epoch || t.version != ac.Version {
		if after != 0 {
			if ac, err = r.l.cfg.Store.Active(ctx, r.session, epoch, 0); err != nil {
				return nil, 0, err
			}
		}
		t = newTranscript(epoch, ac.Version)
		// The system message keeps the index of the epoch's (and the
		// release's) first request through compactions: a newer one
		// follows the history, and a compaction changes the prefix only
		// from its cut on.
		if r.index == nil || r.index.epoch != epoch || r.index.release != s.PolicyRevision {
			r.index = &epochIndex{epoch: epoch, release: s.PolicyRevision, index: index}
		}
		t.index, t.shown = r.index.index, r.index.index
		r.transcript = t
	}
	t.skill = func() string { return r.maintenanceSkill(ctx, s.PolicyRevision) }
	for _, e := range ac.Entries {
		t.add(e)
	}
	t.skill = nil
	if index != t.shown {
		t.addIndex(index)
	}
	if t.index != "" {
		system += "\n\n" + t.index
	}
	head := provider.Message{Role: "system", Content: system}
	msgs := make([]provider.Message, 0, len(t.msgs)+1)
	msgs = append(append(msgs, head), t.msgs...)
	t.sent = len(t.msgs)
	hb, _ := json.Marshal(head)
	return msgs, t.bytes + len(hb) + len(toolSchema) + 3, nil
}

// epochIndex is the skill index the system message carries in a context
// epoch under a release.
type epochIndex struct {
	epoch   int64
	release string
	index   string
}

// maintenanceSkill is the message that follows a maintenance goal: the
// maintenance skill of release.
func (r *runner) maintenanceSkill(ctx context.Context, release string) string {
	if r.l.cfg.Maintenance == nil {
		return ""
	}
	body, err := r.l.cfg.Maintenance(ctx, release)
	if err != nil {
		body = "(the maintenance skill cannot be read: " + err.Error() + ")"
	}
	return "[klbr] Maintenance turn: the operator asked for maintenance; the maintenance skill follows.\n\n" + strings.TrimSpace(body)
}

// toolSchema is the python tool as the request carries it.
var toolSchema, _ = json.Marshal(provider.PythonTool(toolDescription))

// noResult answers a call whose result is not (yet) recorded.
const noResult = "status: interrupted\nNo result was recorded for this call; it may not have run."

// transcript is a context epoch's active context rendered as messages,
// built entry by entry. Every assistant message with tool calls is followed
// by one tool message per call, in call order, under the call's id: the
// result recorded for it, or an explicit "no result" until one is (the
// sequence stays valid for the provider whatever happened in between).
type transcript struct {
	epoch   int64
	version int64 // the context version it renders
	last    int64 // the position of the last entry added
	msgs    []provider.Message
	sizes   []int          // each message's serialized size
	bytes   int            // their sum, with separators
	open    map[string]int // call id → index of its tool message, until its result arrives
	entries []tentry
	// index is the skill index the system message carries: the one when
	// the transcript was made. shown is the newest the context shows (a
	// change comes after the history, see addIndex).
	index, shown string
	// sent is how many of msgs a request carried: a message before it
	// is never changed again (a result arriving for a call sent
	// unanswered comes after the history).
	sent int
	// skill, while entries are added, returns the message that follows a
	// maintenance goal ("" for none).
	skill func() string
}

// tentry is an entry of the transcript: the messages it added and the calls
// it opened or answered, so that compaction can take whole groups.
type tentry struct {
	ref     store.EntryRef
	input   bool
	msg, n  int                  // its messages: msgs[msg:msg+n]
	opens   []string             // the calls an assistant entry made
	answers string               // the call a tool entry answered
	discord *store.DiscordSource // a Discord input's source (its images)
}

func newTranscript(epoch, version int64) *transcript {
	return &transcript{epoch: epoch, version: version, open: map[string]int{}}
}

func (t *transcript) push(m provider.Message) {
	b, _ := json.Marshal(m)
	t.msgs = append(t.msgs, m)
	t.sizes = append(t.sizes, len(b))
	t.bytes += len(b) + 1
}

func (t *transcript) add(e store.Entry) {
	t.last = e.Position
	te := tentry{ref: e.Ref(), msg: len(t.msgs)}
	defer func() {
		te.n = len(t.msgs) - te.msg
		t.entries = append(t.entries, te)
	}()
	if e.Summary != nil {
		t.push(provider.Message{Role: "user", Content: history.Frame(*e.Summary)})
		return
	}
	it := e.Item
	if it.Collected != nil {
		// Only what a summary covers is collected, and that never returns
		// to an active context; should one come, it says what it was.
		text := "[klbr record " + it.Kind + ": " + it.Collected.Text() + "]"
		switch it.Role {
		case "tool":
			if i, ok := t.open[it.CallID]; ok {
				delete(t.open, it.CallID)
				te.answers = it.CallID
				m := provider.Message{Role: "tool", ToolCallID: it.CallID, Content: text}
				b, _ := json.Marshal(m)
				t.bytes += len(b) - t.sizes[i]
				t.msgs[i], t.sizes[i] = m, len(b)
			}
		default:
			t.push(provider.Message{Role: "user", Content: text})
		}
		return
	}
	switch it.Role {
	case "input":
		te.input, te.discord = true, it.Discord
		t.push(provider.Message{Role: "user", Content: renderInput(it.Content, it.Discord)})
		if isMaintenance(it.Content) && t.skill != nil {
			if body := t.skill(); body != "" {
				t.push(provider.Message{Role: "user", Content: body})
			}
		}
	case "notice":
		t.push(provider.Message{Role: "user", Content: renderNotice(it.Kind, it.Content)})
	case "assistant":
		var sp struct {
			Text             string           `json:"text"`
			Reasoning        string           `json:"reasoning"`
			ReasoningDetails json.RawMessage  `json:"reasoning_details"`
			Calls            []store.StepCall `json:"tool_calls"`
		}
		if json.Unmarshal(it.Content, &sp) != nil {
			return
		}
		// Reasoning rides along; the route's dialect decides whether it
		// is sent back.
		m := provider.Message{Role: "assistant", Content: sp.Text}
		if sp.Reasoning != "" || len(sp.ReasoningDetails) > 0 {
			m.Reasoning = &provider.Reasoning{Text: sp.Reasoning, Details: sp.ReasoningDetails}
		}
		for _, c := range sp.Calls {
			m.ToolCalls = append(m.ToolCalls, provider.ToolCall{ID: c.ID, Type: "function",
				Function: provider.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
		}
		if m.Content == "" && len(m.ToolCalls) == 0 {
			return
		}
		t.push(m)
		for _, c := range sp.Calls {
			t.open[c.ID] = len(t.msgs)
			te.opens = append(te.opens, c.ID)
			t.push(provider.Message{Role: "tool", ToolCallID: c.ID, Content: noResult})
		}
	case "tool":
		te.answers = it.CallID
		i, ok := t.open[it.CallID]
		if !ok {
			return // an orphan result has no call to answer
		}
		delete(t.open, it.CallID)
		if i < t.sent {
			// A request carried the call unanswered: its tool message
			// stays as sent, and the result follows the history.
			t.push(provider.Message{Role: "user", Content: fmt.Sprintf("[klbr] The result of call %s arrived after it was shown to you without one:\n%s",
				outside.Name(it.CallID), renderResult(*it))})
			return
		}
		m := provider.Message{Role: "tool", ToolCallID: it.CallID, Content: renderResult(*it)}
		b, _ := json.Marshal(m)
		t.bytes += len(b) - t.sizes[i]
		t.msgs[i], t.sizes[i] = m, len(b)
	}
}

// addIndex shows a changed skill index after the history, as part of the
// last entry (compacted with it; the rebuilt transcript's system message
// then carries the index of its time).
func (t *transcript) addIndex(index string) {
	t.shown = index
	body := "[klbr] The skill index changed; it is now:\n\n" + index
	if index == "" {
		body = "[klbr] The skill index changed; no skills are offered now."
	}
	t.push(provider.Message{Role: "user", Content: body})
	if n := len(t.entries); n > 0 {
		t.entries[n-1].n++
	}
}

// isMaintenance says whether an input is an operator's maintenance goal.
func isMaintenance(content json.RawMessage) bool {
	var in struct {
		SourceKind  string `json:"source_kind"`
		Maintenance bool   `json:"maintenance"`
	}
	return json.Unmarshal(content, &in) == nil && in.SourceKind == "operator" && in.Maintenance
}

func renderInput(content json.RawMessage, dc *store.DiscordSource) string {
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
		if isMaintenance(content) {
			return "[maintenance goal] " + in.Text
		}
		return in.Text
	}
	if in.SourceKind == "job" {
		return in.Text // a job's notice is the host's own "[klbr] job N ..." line
	}
	if dc == nil {
		return fmt.Sprintf("[%s %s · %s] %s", in.SourceKind, outside.Name(in.Conversation), outside.Name(in.Author), outside.Text(in.Text))
	}
	// A Discord message with the handles the model addresses it by: the
	// conversation's alias, what kind of message it is, its id, and its
	// attention item when it demands attention.
	where := dc.Alias
	switch {
	case dc.Kind == "dm":
		where += " (DM)"
	case dc.Name != "":
		where += " #" + outside.Name(dc.Name)
	}
	head := fmt.Sprintf("[discord %s · %s · %s · message %s", where, dc.Mode, outside.Name(in.Author), dc.MessageID)
	if dc.Item != 0 {
		head += fmt.Sprintf(" · item %d", dc.Item)
	}
	return head + "] " + outside.Text(in.Text) + renderAttachments(dc.Attachments)
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
	case "turn.ended":
		return "[klbr] Your last attempt was ended by a loop guard: " + str("reason") + ". This is a new attempt."
	case "turn.guidance":
		return "[klbr turn.prepare] " + str("guidance")
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
	if o.Presented != nil {
		return *o.Presented // result.present's, chosen when the cell finished
	}
	return RenderOutcome(o)
}

// RenderOutcome is the host's rendering of a cell's outcome for the model:
// what result.present is given.
func RenderOutcome(o worker.Outcome) string {
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
		} else if o.Output.SpoolError != "" {
			fmt.Fprintf(&b, ", not stored: %s", o.Output.SpoolError)
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
