package provider

import (
	"fmt"

	"github.com/klbr-dev/klbr/internal/config"
)

// Dialect is what one kind of server accepts and requires in a request. The
// response side needs no switch: the reader understands every documented
// form (string or typed-part content, reasoning_content, reasoning,
// reasoning_details, usage in any chunk) whichever server sent it.
//
// The table in docs/agent.md cites the documentation and public reports
// each rule comes from; keep the two in step.
type Dialect struct {
	Name string
	// StreamUsage sends stream_options.include_usage with a streaming
	// request. Mistral refuses the field (HTTP 422, extra_forbidden) and
	// sends usage in its last chunk anyway.
	StreamUsage bool
	// Replay, when not ReplayNone, sends stored reasoning back on assistant
	// messages, in the field and on the turns the server requires.
	Replay Replay
	// ToolCallIDs is the form the server accepts for replayed tool call
	// ids; IDsAny takes any unique non-empty id.
	ToolCallIDs IDForm
}

// Replay says which stored reasoning goes back on which assistant messages.
type Replay int

const (
	// ReplayNone sends no reasoning back.
	ReplayNone Replay = iota
	// ReplayDeepSeek sends reasoning_content on every assistant message
	// ("" when none was stored). DeepSeek's thinking mode answers HTTP 400
	// when it is missing on the messages of a user turn (between two user
	// messages) that called a tool, and ignores it elsewhere; sending it
	// only there would change an earlier message of the turn when a later
	// one calls a tool, and break the prompt cache's prefix.
	ReplayDeepSeek
	// ReplayReasoningContent sends reasoning_content on every assistant
	// message that has stored reasoning (llama.cpp's templates read it).
	ReplayReasoningContent
	// ReplayReasoning sends reasoning on every assistant message that has
	// stored reasoning (vLLM 0.16+ and Ollama read this name).
	ReplayReasoning
	// ReplayReasoningDetails sends reasoning_details back verbatim on every
	// assistant message that has them (OpenRouter: signed and encrypted
	// reasoning continues only when it is returned unchanged).
	ReplayReasoningDetails
)

func (r Replay) String() string {
	switch r {
	case ReplayDeepSeek:
		return "reasoning_content on every assistant message"
	case ReplayReasoningContent:
		return "reasoning_content"
	case ReplayReasoning:
		return "reasoning"
	case ReplayReasoningDetails:
		return "reasoning_details, verbatim"
	}
	return "none"
}

// IDForm is a form of tool call id a server accepts.
type IDForm int

const (
	// IDsAny: any non-empty id, unique in the request.
	IDsAny IDForm = iota
	// IDsMistral: exactly 9 characters of a-z, A-Z, 0-9 (Mistral answers
	// HTTP 400 "Tool call id was … but must be a-z, A-Z, 0-9, with a length
	// of 9" to anything else, including the ids other servers generate).
	IDsMistral
)

// dialects are the servers' rules, by config name.
var dialects = map[string]Dialect{
	config.DialectOpenAI:   {Name: config.DialectOpenAI, StreamUsage: true},
	config.DialectDeepSeek: {Name: config.DialectDeepSeek, StreamUsage: true, Replay: ReplayDeepSeek},
	config.DialectMistral:  {Name: config.DialectMistral, StreamUsage: false, ToolCallIDs: IDsMistral},
	// llama.cpp sends usage in its last chunk whether asked or not, and
	// accepts the field.
	config.DialectLlamaCpp: {Name: config.DialectLlamaCpp, StreamUsage: true},
	config.DialectVLLM:     {Name: config.DialectVLLM, StreamUsage: true},
	config.DialectOllama:   {Name: config.DialectOllama, StreamUsage: true},
	config.DialectOpenRouter: {Name: config.DialectOpenRouter, StreamUsage: true,
		Replay: ReplayReasoningDetails},
}

// optInReplay is the replay a dialect uses when reasoning_replay = true
// turns it on (for a dialect whose default is none).
var optInReplay = map[string]Replay{
	config.DialectOpenAI:   ReplayReasoningContent,
	config.DialectLlamaCpp: ReplayReasoningContent,
	config.DialectVLLM:     ReplayReasoning,
	config.DialectOllama:   ReplayReasoning,
	config.DialectMistral:  ReplayNone,
}

// DialectOf returns the dialect route uses, with its overrides applied.
func DialectOf(route config.Route) (Dialect, error) {
	name := route.Dialect
	if name == "" {
		name = config.DialectOpenAI
	}
	d, ok := dialects[name]
	if !ok {
		return Dialect{}, fmt.Errorf("provider: unknown dialect %q", route.Dialect)
	}
	if route.StreamUsage != nil {
		d.StreamUsage = *route.StreamUsage
	}
	if route.ReasoningReplay != nil {
		switch {
		case !*route.ReasoningReplay:
			d.Replay = ReplayNone
		case d.Replay == ReplayNone:
			d.Replay = optInReplay[name]
		}
	}
	return d, nil
}
