package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
)

// wireToolCall is a tool call as it appears in a message or a delta.
type wireToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// wireMessage is a choice's message (non-streaming) or delta (streaming).
type wireMessage struct {
	Content          *string        `json:"content"`
	ReasoningContent *string        `json:"reasoning_content"`
	Reasoning        *string        `json:"reasoning"`
	ToolCalls        []wireToolCall `json:"tool_calls"`
}

type wireChoice struct {
	Index        int          `json:"index"`
	Message      *wireMessage `json:"message"`
	Delta        *wireMessage `json:"delta"`
	FinishReason *string      `json:"finish_reason"`
}

// reasoning returns the message's reasoning text and the field it came in.
// reasoning_content wins when a provider sends both (some send the same text
// under both names; joining them would double it).
func (m *wireMessage) reasoning() (string, string) {
	if m.ReasoningContent != nil && *m.ReasoningContent != "" {
		return *m.ReasoningContent, "reasoning_content"
	}
	if m.Reasoning != nil && *m.Reasoning != "" {
		return *m.Reasoning, "reasoning"
	}
	return "", ""
}

// chunk splits a response object or stream chunk into its choices and the
// other top-level fields.
func splitChunk(data []byte) (choices []wireChoice, rest map[string]json.RawMessage, err error) {
	if err := json.Unmarshal(data, &rest); err != nil {
		return nil, nil, err
	}
	if rest == nil {
		return nil, nil, errors.New("not a JSON object")
	}
	if raw, ok := rest["choices"]; ok {
		delete(rest, "choices")
		if !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if err := json.Unmarshal(raw, &choices); err != nil {
				return nil, nil, fmt.Errorf("choices: %w", err)
			}
		}
	}
	return choices, rest, nil
}

// errorField returns the text of a non-null top-level "error" field.
func errorField(rest map[string]json.RawMessage) (json.RawMessage, bool) {
	raw, ok := rest["error"]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, false
	}
	return raw, true
}

// toolAssembler joins streamed tool-call pieces by index.
type toolAssembler struct {
	calls map[int]*ToolCall
}

func (a *toolAssembler) add(pos int, d wireToolCall) ToolCallDelta {
	idx := pos
	if d.Index != nil {
		idx = *d.Index
	}
	if a.calls == nil {
		a.calls = map[int]*ToolCall{}
	}
	tc := a.calls[idx]
	if tc == nil {
		tc = &ToolCall{Type: "function"}
		a.calls[idx] = tc
	}
	if tc.ID == "" {
		tc.ID = d.ID
	}
	if d.Type != "" {
		tc.Type = d.Type
	}
	// The name normally arrives once; a server that repeats it is not
	// streaming it in pieces.
	if d.Function.Name != "" && d.Function.Name != tc.Function.Name {
		tc.Function.Name += d.Function.Name
	}
	tc.Function.Arguments += d.Function.Arguments
	return ToolCallDelta{Index: idx, ID: d.ID, Name: d.Function.Name, Arguments: d.Function.Arguments}
}

// list returns the calls in index order.
func (a *toolAssembler) list() []ToolCall {
	var out []ToolCall
	for _, i := range slices.Sorted(maps.Keys(a.calls)) {
		out = append(out, *a.calls[i])
	}
	return out
}

// finish validates the calls of a response that ended normally: each needs
// an id and a name. Otherwise none is returned as complete.
func finishCalls(out *Response, calls []ToolCall) *Error {
	for i, tc := range calls {
		if tc.ID == "" || tc.Function.Name == "" {
			out.Incomplete = calls
			return &Error{Kind: KindProtocol, Msg: fmt.Sprintf("tool call %d has no id or no function name; no tool call returned", i)}
		}
	}
	out.ToolCalls = calls
	return nil
}

// maxStreamFactor bounds the event data of one stream at this many times
// the non-streaming body bound.
const maxStreamFactor = 4

// readStream reads an SSE response. Errors from reading the body are
// returned as they are (Complete classifies them); everything else is an
// *Error.
func (c *Client) readStream(body io.Reader, onDelta func(Delta)) (*Response, error) {
	out := &Response{Raw: map[string]json.RawMessage{}}
	var content, reasoning bytes.Buffer
	var tools toolAssembler
	var usageRaw json.RawMessage
	done := false
	var total int64
	emit := func(d Delta) {
		if onDelta != nil {
			onDelta(d)
		}
	}
	partial := func() {
		out.Content, out.Reasoning = content.String(), reasoning.String()
		out.Incomplete = tools.list()
		if usageRaw != nil {
			out.Usage = parseUsage(usageRaw)
		}
	}

	dec := newSSEDecoder(body, c.maxLine)
	for !done {
		ev, err := dec.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			partial()
			if errors.Is(err, errSSELineTooLong) {
				return out, &Error{Kind: KindProtocol, Msg: "stream: " + err.Error() + "; response incomplete"}
			}
			return out, err
		}
		data := bytes.TrimSpace(ev.Data)
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			break
		}
		if len(data) == 0 {
			continue
		}
		if total += int64(len(data)); total > maxStreamFactor*c.maxBody {
			partial()
			return out, &Error{Kind: KindProtocol, Msg: fmt.Sprintf("stream: more than %d bytes of events; response incomplete", maxStreamFactor*c.maxBody)}
		}
		choices, rest, err := splitChunk(data)
		if err != nil {
			partial()
			return out, &Error{Kind: KindProtocol, Msg: "stream: malformed chunk: " + c.redact.excerpt([]byte(err.Error())) + "; response incomplete"}
		}
		if raw, ok := errorField(rest); ok || ev.Event == "error" {
			if !ok {
				raw = data
			}
			partial()
			return out, &Error{Kind: KindProtocol, Msg: "stream: provider error: " + c.redact.excerpt(raw) + "; response incomplete"}
		}
		for k, v := range rest {
			if k == "usage" {
				if !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
					usageRaw = v
					out.Raw[k] = v
				}
				continue
			}
			out.Raw[k] = v
		}
		for _, ch := range choices {
			if ch.Index != 0 {
				continue
			}
			if d := ch.Delta; d != nil {
				if d.Content != nil && *d.Content != "" {
					content.WriteString(*d.Content)
					emit(Delta{Content: *d.Content})
				}
				if r, field := d.reasoning(); r != "" {
					reasoning.WriteString(r)
					if out.ReasoningField == "" {
						out.ReasoningField = field
					}
					emit(Delta{Reasoning: r})
				}
				for i, tc := range d.ToolCalls {
					td := tools.add(i, tc)
					emit(Delta{ToolCall: &td})
				}
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				out.FinishReason = *ch.FinishReason
			}
		}
	}
	if !done && out.FinishReason == "" {
		partial()
		msg := "stream ended before [DONE] or a finish_reason; response incomplete"
		if len(out.Incomplete) > 0 {
			msg += fmt.Sprintf(" (%d partial tool call(s) not returned as calls)", len(out.Incomplete))
		}
		return out, &Error{Kind: KindIncomplete, Msg: msg}
	}
	out.Content, out.Reasoning = content.String(), reasoning.String()
	if usageRaw != nil {
		out.Usage = parseUsage(usageRaw)
	}
	if err := finishCalls(out, tools.list()); err != nil {
		return out, err
	}
	return out, nil
}

// readJSON reads a non-streaming response.
func (c *Client) readJSON(body io.Reader) (*Response, error) {
	b, err := io.ReadAll(io.LimitReader(body, c.maxBody+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > c.maxBody {
		return nil, &Error{Kind: KindProtocol, Msg: fmt.Sprintf("response body exceeds %d bytes", c.maxBody)}
	}
	choices, rest, err := splitChunk(b)
	if err != nil {
		return nil, &Error{Kind: KindProtocol, Msg: "malformed response: " + c.redact.excerpt([]byte(err.Error()))}
	}
	if raw, ok := errorField(rest); ok {
		return nil, &Error{Kind: KindProtocol, Msg: "provider error: " + c.redact.excerpt(raw)}
	}
	out := &Response{Raw: rest}
	if u, ok := rest["usage"]; ok {
		out.Usage = parseUsage(u)
	}
	var choice *wireChoice
	for i := range choices {
		if choices[i].Index == 0 {
			choice = &choices[i]
			break
		}
	}
	if choice == nil || choice.Message == nil {
		return out, &Error{Kind: KindProtocol, Msg: "response has no choice 0 with a message"}
	}
	m := choice.Message
	if m.Content != nil {
		out.Content = *m.Content
	}
	out.Reasoning, out.ReasoningField = m.reasoning()
	if choice.FinishReason != nil {
		out.FinishReason = *choice.FinishReason
	}
	out.MessageExtra = messageExtra(b)
	var tools toolAssembler
	for i, tc := range m.ToolCalls {
		tc.Index = nil // a message's calls are whole; position is identity
		tools.add(i, tc)
	}
	if err := finishCalls(out, tools.list()); err != nil {
		return out, err
	}
	return out, nil
}

// messageExtra returns the fields of choice 0's message other than those
// Response carries, as one JSON object, or nil when there are none.
func messageExtra(body []byte) json.RawMessage {
	var v struct {
		Choices []struct {
			Index   int                        `json:"index"`
			Message map[string]json.RawMessage `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	for _, ch := range v.Choices {
		if ch.Index != 0 {
			continue
		}
		for _, k := range []string{"role", "content", "tool_calls", "reasoning_content", "reasoning"} {
			delete(ch.Message, k)
		}
		if len(ch.Message) == 0 {
			return nil
		}
		b, err := json.Marshal(ch.Message)
		if err != nil {
			return nil
		}
		return b
	}
	return nil
}
