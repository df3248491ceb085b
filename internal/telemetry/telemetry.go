// Package telemetry exports the turn loop's traces over OTLP/HTTP with the
// OpenTelemetry SDK: the one package that imports it (the standard library
// cannot speak OTLP). It implements tracing.Tracer; New is called only when
// [telemetry] otlp_endpoint is set, so with none no exporter or goroutine
// exists.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/klbr-dev/klbr/internal/tracing"
)

// Options configure the exporter.
type Options struct {
	// Endpoint is the OTLP/HTTP base URL (http://tempo:4318); a URL
	// without a path is sent to /v1/traces.
	Endpoint       string
	CaptureContent bool
	Service        string // service.name; default "klbr-core"
	Version        string // service.version
	// BatchTimeout bounds how long a span waits before export (default 5 s).
	BatchTimeout time.Duration
}

// Tracer is the exporting tracing.Tracer. Close flushes and stops it.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	capture  bool

	linkMu sync.Mutex        // guards links
	links  map[string]string // Remember's refs by key, at most maxLinks
}

// maxLinks bounds the remembered links: past it they are forgotten (a
// child spawned before then starts unlinked traces).
const maxLinks = 4096

// Remember implements tracing.Tracer.
func (t *Tracer) Remember(key, ref string) {
	if ref == "" {
		return
	}
	t.linkMu.Lock()
	defer t.linkMu.Unlock()
	if len(t.links) >= maxLinks {
		clear(t.links) // simple and bounded; a lost link costs only the link
	}
	t.links[key] = ref
}

// Recall implements tracing.Tracer.
func (t *Tracer) Recall(key string) string {
	t.linkMu.Lock()
	defer t.linkMu.Unlock()
	return t.links[key]
}

var _ tracing.Tracer = (*Tracer)(nil)

// New starts the exporter (its batch goroutine runs until Close).
func New(ctx context.Context, o Options) (*Tracer, error) {
	u, err := url.Parse(o.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("telemetry: otlp_endpoint %q is not an http(s) URL", o.Endpoint)
	}
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/v1/traces"
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("telemetry: exporter: %w", err)
	}
	if o.Service == "" {
		o.Service = "klbr-core"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", o.Service)}
	if o.Version != "" {
		attrs = append(attrs, attribute.String("service.version", o.Version))
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = 5 * time.Second
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(o.BatchTimeout)),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
	)
	return &Tracer{provider: tp, tracer: tp.Tracer("github.com/klbr-dev/klbr/internal/turn"), capture: o.CaptureContent, links: map[string]string{}}, nil
}

// CaptureContent implements tracing.Tracer.
func (t *Tracer) CaptureContent() bool { return t.capture }

// Start implements tracing.Tracer.
func (t *Tracer) Start(ctx context.Context, name string, o tracing.Options) (context.Context, tracing.Span) {
	opts := make([]trace.SpanStartOption, 0, 3)
	if o.Root {
		opts = append(opts, trace.WithNewRoot())
	}
	if o.Link != "" {
		if sc := parseRef(o.Link); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	if len(o.Attrs) > 0 {
		opts = append(opts, trace.WithAttributes(convert(o.Attrs)...))
	}
	ctx, s := t.tracer.Start(ctx, name, opts...)
	return ctx, span{s}
}

// Flush exports what is buffered now.
func (t *Tracer) Flush(ctx context.Context) error { return t.provider.ForceFlush(ctx) }

// Close flushes and stops the exporter; closing twice is safe.
func (t *Tracer) Close(ctx context.Context) error {
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("telemetry: close: %w", err)
	}
	return nil
}

type span struct{ s trace.Span }

func (s span) Recording() bool { return s.s.IsRecording() }

func (s span) Set(attrs ...tracing.Attr) { s.s.SetAttributes(convert(attrs)...) }

func (s span) End(err error) {
	if err != nil {
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

func (s span) TraceID() string { return s.s.SpanContext().TraceID().String() }

func (s span) Ref() string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), s.s), carrier)
	return carrier["traceparent"]
}

func parseRef(ref string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": ref})
	return trace.SpanContextFromContext(ctx)
}

func convert(attrs []tracing.Attr) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, len(attrs))
	for _, a := range attrs {
		switch v := a.Value.(type) {
		case string:
			kv = append(kv, attribute.String(a.Key, v))
		case int64:
			kv = append(kv, attribute.Int64(a.Key, v))
		case float64:
			kv = append(kv, attribute.Float64(a.Key, v))
		case bool:
			kv = append(kv, attribute.Bool(a.Key, v))
		case []string:
			kv = append(kv, attribute.StringSlice(a.Key, v))
		}
	}
	return kv
}
