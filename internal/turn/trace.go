package turn

import (
	"context"
	"encoding/json"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// The spans of an attempt's trace (Config.Tracer). Their attributes follow
// the OpenTelemetry GenAI semantic conventions where one applies; message
// text and code are added only when the tracer captures content. Without a
// tracer each helper returns at its first check.

// maxTraceContent bounds captured content per attribute.
const maxTraceContent = 16 << 10

// attemptSpan starts the attempt's trace: a new root.
func (r *runner) attemptSpan(ctx context.Context) (context.Context, tracing.Span) {
	if r.l.cfg.Tracer == nil {
		return ctx, tracing.Nop
	}
	ctx = tracing.WithTracer(ctx, r.l.cfg.Tracer)
	return tracing.Start(ctx, "klbr.attempt", tracing.Options{Root: true, Link: r.l.parentRef(r.session),
		Attrs: []tracing.Attr{tracing.String("klbr.session", r.session)}})
}

// modelSpan starts a model request's span.
func (r *runner) modelSpan(ctx context.Context, msgs []provider.Message) (context.Context, tracing.Span) {
	if tracing.From(ctx) == nil {
		return ctx, tracing.Nop
	}
	cfg := &r.l.cfg
	attrs := []tracing.Attr{tracing.String("gen_ai.operation.name", "chat"), tracing.String("gen_ai.request.model", cfg.ModelName),
		tracing.String("klbr.route", cfg.Route), tracing.String("klbr.session", r.session)}
	if tracing.Capture(ctx) {
		if b, err := json.Marshal(msgs); err == nil {
			attrs = append(attrs, tracing.String("gen_ai.input.messages", clip(string(b), maxTraceContent)))
		}
	}
	return tracing.Start(ctx, "chat "+cfg.ModelName, tracing.Options{Attrs: attrs})
}

// endModelSpan records a model request's outcome, usage and cost.
func (r *runner) endModelSpan(ctx context.Context, sp tracing.Span, resp *provider.Response, err error) {
	if !sp.Recording() {
		return
	}
	sp.Set(tracing.String("klbr.route", answeredBy(r.l.cfg.Route, resp, err)))
	if resp != nil {
		u := resp.Usage
		for _, n := range []struct {
			key string
			v   *int
		}{{"gen_ai.usage.input_tokens", u.PromptTokens}, {"gen_ai.usage.output_tokens", u.CompletionTokens},
			{"gen_ai.usage.cache_read.input_tokens", u.CacheReadTokens}, {"gen_ai.usage.cache_creation.input_tokens", u.CacheWriteTokens}} {
			if n.v != nil {
				sp.Set(tracing.Int(n.key, int64(*n.v)))
			}
		}
		if resp.FinishReason != "" {
			sp.Set(tracing.Strings("gen_ai.response.finish_reasons", []string{resp.FinishReason}))
		}
		if resp.CostUSD != nil {
			sp.Set(tracing.Float("klbr.cost_usd", *resp.CostUSD), tracing.String("klbr.cost_source", resp.CostSource))
		}
		sp.Set(tracing.Int("klbr.tool_calls", int64(len(resp.ToolCalls))))
		if tracing.Capture(ctx) && resp.Content != "" {
			sp.Set(tracing.String("gen_ai.output.messages", clip(resp.Content, maxTraceContent)))
		}
	}
	sp.End(err)
}

// cellSpan starts a cell's span.
func cellSpan(ctx context.Context, step int64, call, code string) (context.Context, tracing.Span) {
	if tracing.From(ctx) == nil {
		return ctx, tracing.Nop
	}
	attrs := []tracing.Attr{tracing.Int("klbr.step", step), tracing.String("gen_ai.tool.name", "python"),
		tracing.String("gen_ai.tool.call.id", call)}
	if tracing.Capture(ctx) {
		attrs = append(attrs, tracing.String("klbr.cell.code", clip(code, maxTraceContent)))
	}
	return tracing.Start(ctx, "execute_tool python", tracing.Options{Attrs: attrs})
}

func endCellSpan(sp tracing.Span, res workbench.Result, err error) {
	if !sp.Recording() {
		return
	}
	sp.Set(tracing.Int("klbr.execution", res.Execution))
	if res.Outcome != nil {
		sp.Set(tracing.String("klbr.cell.status", res.Outcome.Status))
	}
	sp.End(err)
}

// compactSpan starts a compaction's span: a child of the attempt's when the
// context's budget forced it, the root of a trace of its own when the
// operator asked (no attempt runs it).
func compactSpan(ctx context.Context, session, by string) (context.Context, tracing.Span) {
	if tracing.From(ctx) == nil {
		return ctx, tracing.Nop
	}
	return tracing.Start(ctx, "klbr.compaction", tracing.Options{Root: by == "operator", Attrs: []tracing.Attr{
		tracing.String("klbr.session", session), tracing.String("klbr.compaction.by", by)}})
}

func endCompactSpan(sp tracing.Span, res history.Result, err error) {
	if !sp.Recording() {
		return
	}
	sp.Set(tracing.String("klbr.compaction.kind", res.Kind), tracing.Int("klbr.compaction.source_tokens", int64(res.Source)),
		tracing.Int("klbr.compaction.summary_tokens", int64(res.Tokens)), tracing.Int("klbr.compaction.requests", int64(res.Attempts)))
	sp.End(err)
}

// attemptAttrs names the attempt on its span once it is recorded.
func attemptAttrs(sp tracing.Span, a *attempt, wake string) {
	if sp.Recording() {
		sp.Set(tracing.Int("klbr.attempt", a.id), tracing.String("klbr.wake", clip(wake, 200)),
			tracing.String("klbr.release", a.pin.Release))
	}
}

func endAttemptSpan(sp tracing.Span, a *attempt, err error) {
	if sp.Recording() {
		sp.Set(tracing.Int("klbr.steps", int64(a.steps)), tracing.Int("klbr.tokens", int64(a.tokens)))
		sp.End(err)
	}
}

// parentRef is the span that spawned session (a child), if remembered.
func (l *Loop) parentRef(session string) string {
	if l.cfg.Tracer == nil {
		return ""
	}
	return l.cfg.Tracer.Recall(session)
}
