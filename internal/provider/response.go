package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
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
// Content and the reasoning fields are kept raw: servers send content as a
// string or as an array of typed parts, and reasoning under several names.
type wireMessage struct {
	Content          wireContent     `json:"content"`
	ReasoningContent looseString     `json:"reasoning_content"`
	Reasoning        looseString     `json:"reasoning"`
	ReasoningDetails json.RawMessage `json:"reasoning_details"`
	ToolCalls        []wireToolCall  `json:"tool_calls"`
}

// looseString is a field that is a string when it is anything: another
// type or null reads as "".
type looseString string

func (s *looseString) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		v, err := jsonString(b)
		*s = looseString(v)
		return err
	}
	return nil
}

// jsonString decodes a JSON string the outer decoder has already checked:
// one without escapes is its bytes (the hot path of every delta); others
// go through encoding/json.
func jsonString(b []byte) (string, error) {
	if len(b) >= 2 && b[len(b)-1] == '"' {
		inner := b[1 : len(b)-1]
		if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			return string(inner), nil
		}
	}
	var v string
	err := json.Unmarshal(b, &v)
	return v, err
}

// wireContent is a content value: a string (decoded at once, the common
// case) or an array of parts (kept raw for readContent).
type wireContent struct {
	text  string
	parts json.RawMessage
}

func (c *wireContent) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) == 0 || b[0] == 'n':
		return nil
	case b[0] == '"':
		var err error
		c.text, err = jsonString(b)
		return err
	}
	c.parts = append(json.RawMessage(nil), b...)
	return nil
}

type wireChoice struct {
	Index        int          `json:"index"`
	Message      *wireMessage `json:"message"`
	Delta        *wireMessage `json:"delta"`
	FinishReason *string      `json:"finish_reason"`
}

// parts is what a message or delta says: its text, its reasoning and the
// field the reasoning came in.
type parts struct {
	text, reasoning, field string
}

// read returns what m says. Reasoning comes from the first documented field
// that has any, in this order: reasoning_content, reasoning, the text of
// reasoning_details, thinking parts of the content (Mistral). Servers that
// send the same text under two names (OpenRouter: reasoning and
// reasoning_details; vLLM during its rename: reasoning and
// reasoning_content) would double it if they were joined.
func (m *wireMessage) read() (parts, error) {
	var p parts
	text, thinking := m.Content.text, ""
	var err error
	if m.Content.parts != nil {
		text, thinking, err = readContent(m.Content.parts)
	}
	if err != nil {
		return p, err
	}
	p.text = text
	switch {
	case m.ReasoningContent != "":
		p.reasoning, p.field = string(m.ReasoningContent), "reasoning_content"
	case m.Reasoning != "":
		p.reasoning, p.field = string(m.Reasoning), "reasoning"
	case detailsText(m.ReasoningDetails) != "":
		p.reasoning, p.field = detailsText(m.ReasoningDetails), "reasoning_details"
	case thinking != "":
		p.reasoning, p.field = thinking, "content.thinking"
	}
	return p, nil
}

// rawString returns the string raw holds, "" for null, absent or a value of
// another type.
func rawString(raw json.RawMessage) string {
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// contentPart is one typed part of an array content: {"type":"text",
// "text":…}, or Mistral's {"type":"thinking","thinking":[{"type":"text",
// "text":…}]} (thinking may also be a plain string). Other types (image,
// reference, audio) carry no text here.
type contentPart struct {
	Type     string          `json:"type"`
	Text     json.RawMessage `json:"text"`
	Thinking json.RawMessage `json:"thinking"`
}

// readContent reads a content value: null, a string, or an array of parts.
func readContent(raw json.RawMessage) (text, thinking string, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' {
		return "", "", nil
	}
	if raw[0] == '"' {
		err = json.Unmarshal(raw, &text)
		return text, "", err
	}
	if raw[0] != '[' {
		return "", "", errors.New("content is neither a string nor an array of parts")
	}
	var ps []contentPart
	if err := json.Unmarshal(raw, &ps); err != nil {
		return "", "", fmt.Errorf("content parts: %w", err)
	}
	var t, th strings.Builder
	for _, p := range ps {
		switch p.Type {
		case "text":
			t.WriteString(rawString(p.Text))
		case "thinking":
			th.WriteString(thinkingText(p.Thinking))
		}
	}
	return t.String(), th.String(), nil
}

// thinkingText flattens a thinking part's value: a string, or an array of
// text parts.
func thinkingText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	if raw[0] == '"' {
		return rawString(raw)
	}
	var ps []contentPart
	if json.Unmarshal(raw, &ps) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range ps {
		if p.Type == "text" || p.Type == "" {
			b.WriteString(rawString(p.Text))
		}
	}
	return b.String()
}

// detailItem is one reasoning_details entry (OpenRouter): reasoning.text
// (text, signature), reasoning.summary (summary) or reasoning.encrypted
// (data), with an optional index, id and format.
type detailItem struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Summary string `json:"summary"`
}

// detailsText returns the readable text of a reasoning_details array.
func detailsText(raw json.RawMessage) string {
	if len(raw) == 0 || raw[0] != '[' {
		return ""
	}
	var items []detailItem
	if json.Unmarshal(raw, &items) != nil {
		return ""
	}
	var b strings.Builder
	for _, it := range items {
		switch it.Type {
		case "reasoning.text":
			b.WriteString(it.Text)
		case "reasoning.summary":
			b.WriteString(it.Summary)
		}
	}
	return b.String()
}

// detailsAssembler joins streamed reasoning_details: entries with the same
// index are one entry whose text, summary and data arrive in pieces; the
// other fields are taken from the first piece that has them.
type detailsAssembler struct {
	items []map[string]json.RawMessage
	byIdx map[string]int
}

func (a *detailsAssembler) add(raw json.RawMessage) {
	if len(raw) == 0 || raw[0] != '[' {
		return
	}
	var items []map[string]json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return
	}
	if a.byIdx == nil {
		a.byIdx = map[string]int{}
	}
	for _, it := range items {
		key := ""
		if idx, ok := it["index"]; ok {
			key = string(idx) + "\x00" + rawString(it["type"])
		}
		i, ok := a.byIdx[key]
		if key == "" || !ok {
			a.byIdx[key] = len(a.items)
			a.items = append(a.items, it)
			continue
		}
		cur := a.items[i]
		for k, v := range it {
			switch k {
			case "text", "summary", "data", "signature":
				if s := rawString(v); s != "" {
					joined, _ := json.Marshal(rawString(cur[k]) + s)
					cur[k] = joined
				}
			default:
				if _, ok := cur[k]; !ok || bytes.Equal(cur[k], []byte("null")) {
					cur[k] = v
				}
			}
		}
	}
}

func (a *detailsAssembler) json() json.RawMessage {
	if len(a.items) == 0 {
		return nil
	}
	b, err := json.Marshal(a.items)
	if err != nil {
		return nil
	}
	return b
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

// streamError returns the error a chunk or body reports: a non-null
// top-level "error" (OpenAI, OpenRouter, llama.cpp, Ollama), a top-level
// "object": "error" (vLLM, Mistral), or the whole chunk of an "error" event.
func streamError(rest map[string]json.RawMessage, event string, data []byte) (json.RawMessage, bool) {
	if raw, ok := rest["error"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return data, true
	}
	if bytes.Equal(bytes.TrimSpace(rest["object"]), []byte(`"error"`)) || event == "error" {
		return data, true
	}
	return nil, false
}

// toolAssembler joins streamed tool-call pieces. A piece belongs to the
// call at its index, unless it brings a new non-empty id for an index whose
// call already has another id: then it starts a new call (Ollama sends
// every parallel call with index 0). A piece without an index belongs to
// the call with its id, or starts one. A piece with neither continues the
// last call, unless it is not the first of its delta, or it names a
// function while the last call already has a name and complete arguments
// (older Ollama sent whole calls so): then it starts one.
type toolAssembler struct {
	calls []*ToolCall
	byIdx map[int]int // index → position in calls of its current call
	last  int
}

func (a *toolAssembler) add(d wireToolCall, nth int) ToolCallDelta {
	pos := -1
	switch {
	case d.Index != nil:
		if a.byIdx == nil {
			a.byIdx = map[int]int{}
		}
		if p, ok := a.byIdx[*d.Index]; ok && (d.ID == "" || a.calls[p].ID == "" || a.calls[p].ID == d.ID) {
			pos = p
		}
	case d.ID != "":
		for i, c := range a.calls {
			if c.ID == d.ID {
				pos = i
			}
		}
	case len(a.calls) > 0 && nth == 0:
		last := a.calls[a.last]
		if d.Function.Name == "" || last.Function.Name == "" || !json.Valid([]byte(last.Function.Arguments)) {
			pos = a.last
		}
	}
	if pos < 0 {
		pos = len(a.calls)
		a.calls = append(a.calls, &ToolCall{Type: "function"})
		if d.Index != nil {
			a.byIdx[*d.Index] = pos
		}
	}
	a.last = pos
	tc := a.calls[pos]
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
	return ToolCallDelta{Index: pos, ID: d.ID, Name: d.Function.Name, Arguments: d.Function.Arguments}
}

// list returns the calls in the order they started.
func (a *toolAssembler) list() []ToolCall {
	var out []ToolCall
	for _, c := range a.calls {
		out = append(out, *c)
	}
	return out
}

// finishCalls validates the calls of a response that ended normally: each
// needs a function name, or none is returned as complete. A call without an
// id, with the id of an earlier call of the response, or with one over 256
// bytes gets one made up (MadeUpIDs keeps what the model sent): a result
// answers its call by id.
func finishCalls(out *Response, calls []ToolCall) *Error {
	used := map[string]bool{}
	for _, tc := range calls {
		used[tc.ID] = true
	}
	seen := map[string]bool{}
	for i := range calls {
		tc := &calls[i]
		if tc.Function.Name == "" {
			out.Incomplete = calls
			return &Error{Kind: KindProtocol, Msg: fmt.Sprintf("tool call %d has no function name; no tool call returned", i)}
		}
		if tc.ID == "" || seen[tc.ID] || len(tc.ID) > maxCallID {
			id := genCallID(rawString(out.Raw["id"])+"\x00"+tc.Function.Name+"\x00"+tc.Function.Arguments, i, used)
			used[id] = true
			if out.MadeUpIDs == nil {
				out.MadeUpIDs = map[string]string{}
			}
			out.MadeUpIDs[id] = tc.ID
			tc.ID = id
		}
		seen[tc.ID] = true
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
	var details detailsAssembler
	var usageRaw json.RawMessage
	done := false
	var total int64
	emit := func(d Delta) {
		if onDelta != nil {
			onDelta(d)
		}
	}
	settle := func() {
		out.Content, out.Reasoning = content.String(), reasoning.String()
		out.ReasoningDetails = details.json()
		if usageRaw != nil {
			out.Usage = parseUsage(usageRaw, out.Raw["timings"])
		}
	}
	partial := func() {
		settle()
		out.Incomplete = tools.list()
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
		// Usage first: a chunk that reports an error may report the tokens
		// the request cost too.
		for k, v := range rest {
			if k == "usage" {
				if !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
					usageRaw = v
					out.Raw[k] = v
				}
				continue
			}
			if k != "error" {
				out.Raw[k] = v
			}
		}
		if raw, ok := streamError(rest, ev.Event, data); ok {
			partial()
			return out, c.providerError(raw, true)
		}
		for _, ch := range choices {
			if ch.Index != 0 {
				continue
			}
			if d := ch.Delta; d != nil {
				p, err := d.read()
				if err != nil {
					partial()
					return out, &Error{Kind: KindProtocol, Msg: "stream: malformed delta: " + c.redact.excerpt([]byte(err.Error())) + "; response incomplete"}
				}
				if p.text != "" {
					content.WriteString(p.text)
					emit(Delta{Content: p.text})
				}
				if p.reasoning != "" {
					reasoning.WriteString(p.reasoning)
					if out.ReasoningField == "" {
						out.ReasoningField = p.field
					}
					emit(Delta{Reasoning: p.reasoning})
				}
				details.add(d.ReasoningDetails)
				for j, tc := range d.ToolCalls {
					td := tools.add(tc, j)
					emit(Delta{ToolCall: &td})
				}
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				out.FinishReason = *ch.FinishReason
			}
		}
		if out.FinishReason == "error" {
			// OpenRouter ends a failed generation so, usually with an error
			// field (handled above); without one the answer is cut short.
			partial()
			return out, &Error{Kind: KindProvider, Msg: "stream: the provider ended the response with finish_reason \"error\"; response incomplete"}
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
	settle()
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
	out := &Response{Raw: rest}
	if u, ok := rest["usage"]; ok {
		out.Usage = parseUsage(u, rest["timings"])
	}
	if raw, ok := streamError(rest, "", b); ok {
		return out, c.providerError(raw, false)
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
	p, err := m.read()
	if err != nil {
		return out, &Error{Kind: KindProtocol, Msg: "malformed message: " + c.redact.excerpt([]byte(err.Error()))}
	}
	out.Content, out.Reasoning, out.ReasoningField = p.text, p.reasoning, p.field
	if d := bytes.TrimSpace(m.ReasoningDetails); len(d) > 0 && d[0] == '[' {
		out.ReasoningDetails = d
	}
	if choice.FinishReason != nil {
		out.FinishReason = *choice.FinishReason
	}
	out.MessageExtra = messageExtra(b)
	// A message's calls are whole; position is identity.
	calls := make([]ToolCall, 0, len(m.ToolCalls))
	for _, tc := range m.ToolCalls {
		t := tc.Type
		if t == "" {
			t = "function"
		}
		calls = append(calls, ToolCall{ID: tc.ID, Type: t, Function: FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}})
	}
	if len(calls) == 0 {
		calls = nil
	}
	if err := finishCalls(out, calls); err != nil {
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
		for _, k := range []string{"role", "content", "tool_calls", "reasoning_content", "reasoning", "reasoning_details"} {
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
