// Package tracing is the turn loop's view of traces: spans with attributes,
// started under a context, and nothing else. The OpenTelemetry exporter
// (internal/telemetry) implements Tracer; with none installed every call
// here is a context lookup that finds nothing and returns a no-op span, so
// tracing off costs no allocation, goroutine or export.
package tracing

import "context"

// Attr is one span attribute. Value is a string, int64, float64, bool or
// []string; anything else is dropped.
type Attr struct {
	Key   string
	Value any
}

// String, Int, Float, Bool and Strings make attributes.
func String(k, v string) Attr        { return Attr{k, v} }
func Int(k string, v int64) Attr     { return Attr{k, v} }
func Float(k string, v float64) Attr { return Attr{k, v} }
func Bool(k string, v bool) Attr     { return Attr{k, v} }
func Strings(k string, v []string) Attr {
	return Attr{k, v}
}

// Options shape a new span.
type Options struct {
	// Root starts a new trace instead of a child of ctx's span.
	Root bool
	// Link is a span this one follows from (a parent agent's spawn),
	// as a W3C traceparent; "" for none.
	Link  string
	Attrs []Attr
}

// Tracer starts spans: telemetry.Tracer.
type Tracer interface {
	Start(ctx context.Context, name string, o Options) (context.Context, Span)
	// CaptureContent reports whether message text and code may go into
	// attributes ([telemetry] capture_content).
	CaptureContent() bool
	// Remember keeps ref (a span's Ref) under key, bounded: a child
	// session's traces link to the span that spawned it. Recall returns
	// it, or "".
	Remember(key, ref string)
	Recall(key string) string
}

// Span is one started span; End it once.
type Span interface {
	// Recording is false for the no-op span: skip building attributes.
	Recording() bool
	Set(attrs ...Attr)
	// End ends the span, failed with err if it is not nil.
	End(err error)
	// TraceID is the trace's id in hex ("" when not recording).
	TraceID() string
	// Ref is the span as a W3C traceparent, for a link ("" when not recording).
	Ref() string
}

type tracerKey struct{}

// WithTracer returns ctx carrying t: spans started under it are t's. A nil
// t returns ctx unchanged.
func WithTracer(ctx context.Context, t Tracer) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, tracerKey{}, t)
}

// From returns ctx's tracer, or nil.
func From(ctx context.Context) Tracer {
	t, _ := ctx.Value(tracerKey{}).(Tracer)
	return t
}

type spanKey struct{}

// Start starts a span under ctx with ctx's tracer; without one it returns
// ctx and a no-op span. The returned ctx carries the span (SpanFrom).
func Start(ctx context.Context, name string, o Options) (context.Context, Span) {
	t := From(ctx)
	if t == nil {
		return ctx, Nop
	}
	ctx, s := t.Start(ctx, name, o)
	return context.WithValue(ctx, spanKey{}, s), s
}

// SpanFrom returns the span Start put in ctx, or Nop.
func SpanFrom(ctx context.Context) Span {
	if s, ok := ctx.Value(spanKey{}).(Span); ok {
		return s
	}
	return Nop
}

// Capture reports whether ctx's tracer may record content.
func Capture(ctx context.Context) bool {
	t := From(ctx)
	return t != nil && t.CaptureContent()
}

// Nop is the span of no tracer.
var Nop Span = nop{}

type nop struct{}

func (nop) Recording() bool { return false }
func (nop) Set(...Attr)     {}
func (nop) End(error)       {}
func (nop) TraceID() string { return "" }
func (nop) Ref() string     { return "" }
