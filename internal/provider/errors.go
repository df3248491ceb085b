package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind classifies a failed request.
type Kind int

const (
	// KindHTTP: the route answered with a non-2xx status (Status, Body).
	KindHTTP Kind = iota + 1
	// KindNetwork: the connection failed or broke.
	KindNetwork
	// KindTimeout: the route's timeout_seconds passed.
	KindTimeout
	// KindCanceled: the caller's context was canceled or expired.
	KindCanceled
	// KindIncomplete: the stream ended before [DONE] or a finish_reason.
	KindIncomplete
	// KindProtocol: the response is malformed (bad JSON, an oversized SSE
	// line or body, a tool call without a name).
	KindProtocol
	// KindProvider: the server reported an error inside a 200 response (an
	// error chunk mid-stream, an error body, finish_reason "error").
	KindProvider
)

func (k Kind) String() string {
	switch k {
	case KindHTTP:
		return "http"
	case KindNetwork:
		return "network"
	case KindTimeout:
		return "timeout"
	case KindCanceled:
		return "canceled"
	case KindIncomplete:
		return "incomplete"
	case KindProtocol:
		return "protocol"
	case KindProvider:
		return "provider"
	}
	return "unknown"
}

// maxErrorExcerpt bounds Error.Body.
const maxErrorExcerpt = 1024

// Error is the error Complete returns. Its text never holds the API key.
type Error struct {
	Kind       Kind
	Status     int           // KindHTTP: the HTTP status; KindProvider: the error's numeric code, if any
	Body       string        // KindHTTP: a bounded excerpt of the body, key redacted
	RetryAfter time.Duration // KindHTTP: the Retry-After header (seconds or an HTTP date), 0 if none
	Msg        string        // what went wrong, key redacted
	// Message and Code are the provider's own error message and code (or
	// type), read from an error body or chunk; "" when it sent none.
	Message string
	Code    string
	URL     string // the request's URL (never a key: keys travel in a header)
	Route   string // the route's name, when a Router sent the request
	err     error  // for errors.Is (context errors); its text is not shown
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("model request")
	if e.Route != "" {
		fmt.Fprintf(&b, " (route %s)", e.Route)
	}
	if e.URL != "" {
		fmt.Fprintf(&b, " to %s", e.URL)
	}
	b.WriteString(": ")
	switch e.Kind {
	case KindHTTP:
		fmt.Fprintf(&b, "HTTP %d", e.Status)
		switch {
		case e.Message != "":
			fmt.Fprintf(&b, ": %s", e.Message)
		case e.Body != "":
			fmt.Fprintf(&b, ": %s", e.Body)
		}
	case KindProvider:
		b.WriteString(e.Msg)
		if e.Message != "" {
			fmt.Fprintf(&b, ": %s", e.Message)
		}
	default:
		b.WriteString(e.Msg)
	}
	if e.Code != "" {
		fmt.Fprintf(&b, " (code %s)", e.Code)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.err }

// Retryable reports whether a new attempt may succeed: 408, 409, 429 and
// 5xx statuses, network failures, timeouts and streams cut short. A 4xx, a
// malformed response or the caller's cancellation is not retryable.
func (e *Error) Retryable() bool {
	switch e.Kind {
	case KindHTTP:
		return e.Status == 408 || e.Status == 409 || e.Status == 429 || e.Status >= 500
	case KindNetwork, KindTimeout, KindIncomplete:
		return true
	case KindProvider:
		// Mid-stream errors are mostly the server's (overloaded, provider
		// disconnected); one that names a client status is not.
		s := e.Status
		return !(s >= 400 && s < 500 && s != 408 && s != 409 && s != 429)
	}
	return false
}

// parseErrorBody reads a provider's error object in the shapes servers
// send: {"error": {"message", "code", "type"}} (OpenAI, DeepSeek,
// OpenRouter, llama.cpp, Ollama), {"error": "text"}, {"object": "error",
// "message", "type", "code"} (vLLM, Mistral; Mistral's message may be an
// object), {"detail": …} (FastAPI validation errors). It returns the
// message, the code (or else the type) and a numeric code, if any.
func parseErrorBody(b []byte) (msg, code string, status int) {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil || top == nil {
		return "", "", 0
	}
	obj := top
	if e, ok := top["error"]; ok {
		if s := rawString(e); s != "" {
			return s, "", 0
		}
		var inner map[string]json.RawMessage
		if json.Unmarshal(e, &inner) == nil && inner != nil {
			obj = inner
		}
	}
	msg = textOf(obj["message"])
	if msg == "" {
		msg = textOf(obj["detail"])
	}
	code = textOf(obj["code"])
	if n := optInt(obj["code"]); n != nil {
		status = *n
	}
	if code == "" {
		code = textOf(obj["type"])
	}
	return msg, code, status
}

// textOf returns a string value, or a non-null value's compact JSON.
func textOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return ""
	}
	if raw[0] == '"' {
		return rawString(raw)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return ""
	}
	return buf.String()
}

// providerError is the *Error for an error the provider reported in a 200
// response (raw: the chunk or body).
func (c *Client) providerError(raw []byte, stream bool) *Error {
	msg, code, status := parseErrorBody(raw)
	e := &Error{Kind: KindProvider, Msg: "the provider reported an error", Message: c.redact.excerpt([]byte(msg)),
		Code: c.redact.excerpt([]byte(code)), Status: status}
	if stream {
		e.Msg = "the provider reported an error mid-stream; response incomplete"
	}
	if e.Message == "" {
		e.Message = c.redact.excerpt(raw)
	}
	return e
}

// IsRetryable reports whether err is an *Error that is Retryable.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable()
}

// redactor removes a secret from text meant for errors and logs.
type redactor string

func (r redactor) clean(s string) string {
	if r != "" {
		s = strings.ReplaceAll(s, string(r), "[redacted]")
	}
	return s
}

// excerpt returns a bounded, valid UTF-8, single-line excerpt of b.
func (r redactor) excerpt(b []byte) string {
	s := r.clean(strings.ToValidUTF8(string(b), "\uFFFD"))
	if len(s) > maxErrorExcerpt {
		cut := maxErrorExcerpt
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	s = strings.Map(func(c rune) rune {
		if c == '\n' || c == '\r' || c == '\t' {
			return ' '
		}
		if c < 0x20 || c == 0x7f {
			return -1
		}
		return c
	}, s)
	return strings.TrimSpace(s)
}
