package hooks

import (
	"errors"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/tracing"
)

// maxTraceContent bounds a hook's input or result in a span when the
// tracer captures content.
const maxTraceContent = 16 << 10

// endHookSpan ends an invocation's span (a child of the caller's: the
// attempt, a cell, a send) with its slot, handler, outcome, latency and
// release. The input and the result are content: they go in only when the
// tracer captures content.
func endHookSpan(span tracing.Span, c *call, handler string, capture bool) {
	if !span.Recording() {
		return
	}
	r := &c.rec
	span.Set(tracing.String("klbr.hook.slot", r.Slot), tracing.String("klbr.hook.handler", handler),
		tracing.String("klbr.hook.outcome", r.Outcome), tracing.Float("klbr.hook.latency_ms", float64(r.Latency.Microseconds())/1000),
		tracing.String("klbr.release", r.Release), tracing.Int("klbr.behavior_epoch", r.Epoch), tracing.String("klbr.session", r.Session))
	if capture {
		span.Set(tracing.String("klbr.hook.input", clip(string(r.Input), maxTraceContent)),
			tracing.String("klbr.hook.result", clip(string(c.result), maxTraceContent)))
	}
	var err error
	if r.Outcome != "ok" { // the error's text may quote the input: the outcome only
		err = errors.New("hook " + r.Outcome)
	}
	span.End(err)
}

// clip cuts s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
