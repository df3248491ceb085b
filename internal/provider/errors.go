package provider

import (
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
	// line or body, a tool call without id or name, an error event).
	KindProtocol
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
	}
	return "unknown"
}

// maxErrorExcerpt bounds Error.Body.
const maxErrorExcerpt = 1024

// Error is the error Complete returns. Its text never holds the API key.
type Error struct {
	Kind       Kind
	Status     int           // KindHTTP: the HTTP status
	Body       string        // KindHTTP: a bounded excerpt of the body, key redacted
	RetryAfter time.Duration // KindHTTP: the Retry-After header (seconds or an HTTP date), 0 if none
	Msg        string        // what went wrong, key redacted
	err        error         // for errors.Is (context errors); its text is not shown
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("model request: ")
	if e.Kind == KindHTTP {
		fmt.Fprintf(&b, "HTTP %d", e.Status)
		if e.Body != "" {
			fmt.Fprintf(&b, ": %s", e.Body)
		}
		return b.String()
	}
	b.WriteString(e.Msg)
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
	}
	return false
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
