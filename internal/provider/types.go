package provider

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// ErrNotSent is wrapped by an error that ended a request before it left
// the host (it waited at a spend cap until its context ended): the request
// cost nothing and is no row of the spend ledger.
var ErrNotSent = errors.New("request not sent")

// Message is one chat message as sent to the route.
type Message struct {
	Role       string     // "system", "user", "assistant" or "tool"
	Content    string     // sent as null for an assistant message with tool calls and no text
	ToolCalls  []ToolCall // assistant messages only
	ToolCallID string     // tool messages: the id of the call this answers
	Name       string     // optional

	// Reasoning is the reasoning an assistant message came with, as stored;
	// nil when none. It is not sent as such: the route's dialect decides
	// whether and under which name it goes back (see Replay).
	Reasoning *Reasoning

	// Extra is an opaque JSON object whose fields are added to the message
	// verbatim: provider-specific blocks that the caller stored and must
	// pass back. A field that collides with one of the above is an error.
	Extra json.RawMessage

	// Images go with a user message to a route with vision = true, as
	// image_url parts (data URLs) after the text; a route without vision
	// never receives them (the text describes them). The caller bounds
	// their number and size.
	Images []Image
}

// Image is an image's bytes and media type (image/png, image/jpeg,
// image/gif or image/webp).
type Image struct {
	MediaType string
	Data      []byte
}

// contentParts is a user message's content with its images: a text part,
// then one image_url part each.
func contentParts(text string, images []Image) []any {
	type imageURL struct {
		URL string `json:"url"`
	}
	type part struct {
		Type     string    `json:"type"`
		Text     *string   `json:"text,omitempty"`
		ImageURL *imageURL `json:"image_url,omitempty"`
	}
	parts := []any{part{Type: "text", Text: &text}}
	for _, im := range images {
		parts = append(parts, part{Type: "image_url", ImageURL: &imageURL{URL: "data:" + im.MediaType + ";base64," + base64.StdEncoding.EncodeToString(im.Data)}})
	}
	return parts
}

// Reasoning is an assistant message's stored reasoning: its text and the
// reasoning_details array it came with (OpenRouter), either may be empty.
type Reasoning struct {
	Text    string
	Details json.RawMessage
}

// sent is a message as replay sends it: with the reasoning field its
// dialect adds (key: a JSON value), unless Extra sets the same key.
type sent struct {
	Message
	key string
	val json.RawMessage
}

func (s sent) MarshalJSON() ([]byte, error) { return s.Message.marshal(s.key, s.val) }

// MarshalJSON writes the OpenAI wire form of m, followed by Extra's fields
// (sorted, values byte for byte).
func (m Message) MarshalJSON() ([]byte, error) { return m.marshal("", nil) }

// marshal writes m, then the field key: val when key is set and Extra does
// not set it, then Extra's fields.
func (m Message) marshal(key string, val json.RawMessage) ([]byte, error) {
	type wire struct {
		Role       string     `json:"role"`
		Content    any        `json:"content"`
		ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
		ToolCallID string     `json:"tool_call_id,omitempty"`
		Name       string     `json:"name,omitempty"`
	}
	w := wire{Role: m.Role, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, Name: m.Name}
	if m.Content != "" || len(m.ToolCalls) == 0 {
		w.Content = &m.Content
	}
	if len(m.Images) > 0 && m.Role == "user" {
		w.Content = contentParts(m.Content, m.Images)
	}
	b, err := json.Marshal(w)
	if err != nil || (key == "" && len(m.Extra) == 0) {
		return b, err
	}
	var extra map[string]json.RawMessage
	if len(bytes.TrimSpace(m.Extra)) > 0 {
		if err := json.Unmarshal(m.Extra, &extra); err != nil {
			return nil, fmt.Errorf("message Extra is not a JSON object: %w", err)
		}
	}
	if key != "" {
		if _, ok := extra[key]; !ok {
			b = append(b[:len(b)-1], ',', '"')
			b = append(b, key...)
			b = append(b, '"', ':')
			b = append(append(b, val...), '}')
		}
	}
	if len(extra) == 0 {
		return b, nil
	}
	reserved := []string{"role", "content", "tool_calls", "tool_call_id", "name"}
	var buf bytes.Buffer
	buf.Write(b[:len(b)-1]) // without the closing brace
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if slices.Contains(reserved, k) {
			return nil, fmt.Errorf("message Extra sets %q, which Message already carries", k)
		}
		kb, _ := json.Marshal(k)
		buf.WriteByte(',')
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(extra[k])
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// ToolCall is a complete tool call from an assistant message.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments, a JSON text as
// the model wrote it (not validated here: invalid arguments are the turn
// loop's to answer under the call's id).
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a tool the model may call.
type Tool struct {
	Type     string      `json:"type"` // "function"
	Function FunctionDef `json:"function"`
}

// FunctionDef declares a function tool.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// PythonTool returns the one tool the agent sees: python, with a single
// required string parameter code.
func PythonTool(description string) Tool {
	return Tool{Type: "function", Function: FunctionDef{
		Name:        "python",
		Description: description,
		Parameters:  json.RawMessage(`{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false}`),
	}}
}

// Request is one /chat/completions request.
type Request struct {
	Messages []Message
	Tools    []Tool
	Stream   bool
	// MaxTokens, when positive, bounds the answer (max_tokens).
	MaxTokens int

	// Meta says what the request is for, to the route planner (model.plan);
	// it is not sent.
	Meta RequestMeta

	// OnDelta, when set and Stream is true, receives best-effort deltas as
	// they arrive, on the goroutine that called Complete. It must return
	// quickly. The Response, not the deltas, is the record.
	OnDelta func(Delta)
}

// RequestMeta describes a request to the route planner.
type RequestMeta struct {
	Session string `json:"session"`
	// Purpose is "turn" for an agent step (also when empty), "summary" for
	// a summarizer, or "test" for klbr-core route test.
	Purpose string `json:"purpose"`
	// Directed is set when the step answers a DM, a mention or the operator.
	Directed bool `json:"directed"`
}

// Delta is one streamed increment.
type Delta struct {
	Content   string
	Reasoning string
	ToolCall  *ToolCallDelta
}

// ToolCallDelta is a streamed piece of the tool call at Index.
type ToolCallDelta struct {
	Index     int
	ID        string
	Name      string
	Arguments string
}

// Response is a model's answer.
//
// When Complete returns an error together with a Response, the Response is
// partial: Content and Reasoning hold what arrived, ToolCalls is nil, and any
// tool calls that had started are in Incomplete (never to be run).
type Response struct {
	Content   string
	Reasoning string
	// ReasoningField is the provider field reasoning came in
	// ("reasoning_content", "reasoning", "reasoning_details" or
	// "content.thinking"), "" when there was none.
	ReasoningField string
	// ReasoningDetails is the reasoning_details array the provider sent
	// (OpenRouter), streamed pieces joined by their index; nil when none.
	ReasoningDetails json.RawMessage
	// Route names the route that answered (set by Router).
	Route      string
	ToolCalls  []ToolCall
	Incomplete []ToolCall
	// MadeUpIDs maps the id of each call the client had to name (the model
	// sent no id, or one an earlier call of the response had) to what the
	// model sent ("" for none): an id is how a result answers its call.
	MadeUpIDs    map[string]string
	FinishReason string
	Usage        Usage
	// CostUSD and CostSource are the request's cost as the spend meter
	// reckoned it (spend.Meter.Wrap): the provider's report, else the
	// route's price; nil, "none" when neither; unset when not metered.
	CostUSD    *float64
	CostSource string
	// MessageExtra holds the other fields of the assistant message as the
	// provider sent them (e.g. refusal, annotations, provider-specific
	// blocks), as one JSON object; nil when there are none. Non-streaming
	// responses only: streamed deltas of unknown fields are not assembled.
	// Nothing here is sent back automatically; a caller that must return a
	// block to the route puts it in Message.Extra.
	MessageExtra json.RawMessage
	// Raw keeps the provider's top-level non-delta fields (id, model,
	// created, system_fingerprint, usage, ...; never choices), the last value
	// seen of each when streaming.
	Raw map[string]json.RawMessage
}

// Usage is token accounting as the provider reported it. A nil field means
// the provider did not report it, which is a different statement from 0.
// Nothing here is inferred from anything else.
type Usage struct {
	PromptTokens     *int
	CompletionTokens *int
	TotalTokens      *int
	// CacheReadTokens: OpenAI prompt_tokens_details.cached_tokens, else
	// DeepSeek prompt_cache_hit_tokens.
	CacheReadTokens *int
	// CacheWriteTokens: cache_write_tokens, in prompt_tokens_details or at
	// the top level of usage.
	CacheWriteTokens *int
	// CacheMissTokens: DeepSeek prompt_cache_miss_tokens. Not counted as a
	// write: that would be an inference.
	CacheMissTokens *int
	// CostUSD is the cost the provider reported for the request itself
	// (OpenRouter's usage.cost), in USD; it wins over a configured price.
	CostUSD *float64
}
