// Package history is klbr's lossless history: compaction of the active
// context into summaries whose coverage the host records (the model writes
// only text), and bounded search and exact reads of the originals. The
// tables and their invariants live in internal/store; this package decides
// what to summarize, asks the summarizer outside any transaction, falls
// back to a degraded stub the host writes itself, and commits against the
// context version.
package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// Model answers the summarizer's tool-free requests.
type Model interface {
	Complete(ctx context.Context, req provider.Request) (*provider.Response, error)
}

// Unit is a complete group of active entries: one input or notice, an
// earlier summary, or an assistant message with every result of its tool
// calls. A unit is never split.
type Unit struct {
	Refs      []store.EntryRef
	Tokens    int  // its estimated share of the request
	Protected bool // the current frame's unanswered input: never summarized
}

// Plan is a run to compact, as planned against a context version.
type Plan struct {
	Session string
	Epoch   int64
	Version int64
	Release string // the summary prompt comes from this release
	Units   []Unit
	// Before is the estimated size of the whole request before compaction.
	Before int
	// Reason is why it compacts: "threshold", "budget" or "operator".
	Reason string
}

// Tokens is the run's estimated size.
func (p Plan) Tokens() int {
	n := 0
	for _, u := range p.Units {
		n += u.Tokens
	}
	return n
}

// Refs is the run's entries, in order.
func (p Plan) Refs() []store.EntryRef {
	var out []store.EntryRef
	for _, u := range p.Units {
		out = append(out, u.Refs...)
	}
	return out
}

// Result is a committed compaction.
type Result struct {
	Summary  int64
	Kind     string
	Attempts int // summarizer requests made
	Source   int // estimated tokens of what it replaced
	Tokens   int // estimated tokens of the summary's entry
	// Before and After are the whole request's estimated size before and
	// after: the one measure the operator is shown (Measure).
	Before, After int
	Problems      []string
}

// Measure is how a compaction is reported to the operator, in the compact
// command's answer, tail and the browser alike: the estimated size of the
// context (the whole request, as status's "last request" counts it)
// before and after.
func Measure(before, after int) string {
	return fmt.Sprintf("context about %d → %d tokens (estimated)", before, after)
}

// Config is what a Compactor is made of.
type Config struct {
	Store *store.Store
	Model Model  // the summarizer's route
	Route string // its name, for the record
	// ModelName is the model the route names.
	ModelName string
	// Prompt returns the summary prompt of a release (its
	// prompts/summary.md); empty or an error: DefaultPrompt.
	Prompt func(ctx context.Context, release string) (string, error)
	// Prepare may adjust the prompt (hook summary.prepare); nil: as is.
	Prepare func(ctx context.Context, session string, in PrepareInput) string
	// Estimate turns a rendered size in bytes into tokens (the turn loop's
	// calibrated, per-route estimate).
	Estimate func(bytes int) int
	// Timeout bounds each summarizer request; MaxOutput its answer.
	Timeout   time.Duration
	MaxOutput int
	// Observe is told of each summarizer request's outcome (metrics).
	Observe func(outcome string)
	Log     *slog.Logger
}

// PrepareInput is what summary.prepare sees.
type PrepareInput struct {
	Prompt      string `json:"prompt"`
	SourceBytes int    `json:"source_bytes"`
	Entries     int    `json:"entries"`
	Depth       int    `json:"depth"` // 1 + the deepest summary in the run
}

// Compactor compacts runs of a session's active context.
type Compactor struct{ cfg Config }

// MaxAttempts bounds the summarizer requests of one compaction.
const MaxAttempts = 2

// shrink is the measured margin a summary must achieve: its entry at most
// this fraction of what it replaces.
const shrink = 0.75

// New returns a Compactor.
func New(cfg Config) *Compactor {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 4096
	}
	if cfg.Estimate == nil {
		cfg.Estimate = func(b int) int { return (b + 3) / 4 }
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string) {}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Compactor{cfg: cfg}
}

// Compact summarizes the plan's run and commits the summary in place of
// it: the summarizer's text when it answers usefully within MaxAttempts,
// else a degraded stub the host writes. A plan made against a stale
// version returns store.ErrStaleContext and commits nothing: plan again.
func (c *Compactor) Compact(ctx context.Context, p Plan) (Result, error) {
	cfg := &c.cfg
	src, err := cfg.Store.RunSource(ctx, p.Session, p.Refs())
	if err != nil {
		return Result{}, err
	}
	text, depth := RenderSource(src)
	res := Result{Kind: store.SummaryNormal, Source: p.Tokens()}
	summary := ""
	if cfg.Model != nil {
		prompt := c.prompt(ctx, p.Release)
		if cfg.Prepare != nil {
			prompt = cfg.Prepare(ctx, p.Session, PrepareInput{Prompt: prompt, SourceBytes: len(text), Entries: len(src), Depth: depth})
		}
		maxOut := min(cfg.MaxOutput, max(res.Source/3, 256))
		for res.Attempts < MaxAttempts {
			res.Attempts++
			out, problem := c.ask(ctx, p.Session, prompt, text, maxOut)
			if problem == "" {
				if n := c.entryTokens(out, src); float64(n) > shrink*float64(res.Source) {
					problem = fmt.Sprintf("the summary (about %d tokens) does not shrink its source (about %d tokens) by %.0f%%", n, res.Source, (1-shrink)*100)
				} else {
					summary = out
					break
				}
			}
			res.Problems = append(res.Problems, fmt.Sprintf("attempt %d: %s", res.Attempts, problem))
			if ctx.Err() != nil {
				break
			}
		}
	} else {
		res.Problems = append(res.Problems, "no summarizer route")
	}
	if summary == "" {
		res.Kind = store.SummaryDegraded
		summary = Stub(src, res.Problems)
	}
	res.Tokens = c.entryTokens(summary, src)
	if res.Tokens >= res.Source {
		// Even the stub does not shrink this run: refuse rather than grow.
		return res, fmt.Errorf("%w: a run of about %d tokens cannot be represented in less", ErrNoReduction, res.Source)
	}
	res.Before, res.After = p.Before, p.Before-res.Source+res.Tokens
	notice := map[string]any{"reason": p.Reason, "tokens_before": res.Before, "tokens_after": res.After,
		"source_tokens": res.Source, "summary_tokens": res.Tokens, "route": cfg.Route}
	if len(res.Problems) > 0 {
		notice["problems"] = res.Problems
	}
	err = cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		res.Summary, err = tx.CommitSummary(store.NewSummary{Session: p.Session, Epoch: p.Epoch, Version: p.Version, Covers: p.Refs(),
			Kind: res.Kind, Text: summary, Route: cfg.Route, Model: cfg.ModelName, SourceTokens: res.Source, SummaryTokens: res.Tokens,
			Attempts: res.Attempts, Notice: notice})
		return err
	})
	return res, err
}

// entryTokens estimates the summary's entry as the model will see it.
func (c *Compactor) entryTokens(text string, src []store.SourceEntry) int {
	items := 0
	for _, e := range src {
		if e.Summary != nil {
			items += e.Summary.Items
		} else {
			items++
		}
	}
	// The message's JSON wrapping and the ref's digits, conservatively.
	return c.cfg.Estimate(len(Frame(store.Summary{ID: 1 << 40, Kind: store.SummaryDegraded, Items: items, Text: text})) + 64)
}

// ErrUnavailable reports that compaction cannot run here now.
var ErrUnavailable = errors.New("compaction is unavailable")

// ErrNothingToCompact reports a context with no eligible run.
var ErrNothingToCompact = errors.New("nothing to compact")

// ErrNoReduction reports a run that no representation makes smaller.
var ErrNoReduction = errors.New("compaction would not reduce the context")

func (c *Compactor) prompt(ctx context.Context, release string) string {
	if c.cfg.Prompt != nil {
		if p, err := c.cfg.Prompt(ctx, release); err == nil && strings.TrimSpace(p) != "" {
			return p
		}
	}
	return DefaultPrompt
}

// ask makes one tool-free summarizer request, bounded in time and output.
func (c *Compactor) ask(ctx context.Context, session, prompt, source string, maxOut int) (string, string) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.cfg.Model.Complete(rctx, provider.Request{
		Messages: []provider.Message{
			{Role: "system", Content: prompt},
			{Role: "user", Content: source},
		},
		MaxTokens: maxOut,
		Meta:      provider.RequestMeta{Session: session, Purpose: "summary"},
	})
	if resp != nil {
		c.recordSpend(ctx, session, resp)
	}
	switch {
	case err != nil && rctx.Err() == context.DeadlineExceeded:
		c.cfg.Observe("timeout")
		return "", fmt.Sprintf("no answer within %s", c.cfg.Timeout)
	case err != nil:
		c.cfg.Observe("error")
		return "", "the request failed: " + err.Error()
	}
	out := strings.TrimSpace(resp.Content)
	switch {
	case out == "":
		c.cfg.Observe("empty")
		return "", "the summarizer returned nothing"
	case len(resp.ToolCalls) > 0:
		c.cfg.Observe("invalid")
		return "", "the summarizer answered with tool calls"
	case resp.FinishReason == "length":
		c.cfg.Observe("truncated")
		return "", fmt.Sprintf("the summary was cut off at its output bound (%d tokens)", maxOut)
	}
	c.cfg.Observe("ok")
	return out, ""
}

// recordSpend commits a summary request's ledger row (a summary is no
// model step: its row stands alone).
func (c *Compactor) recordSpend(ctx context.Context, session string, resp *provider.Response) {
	u := resp.Usage
	e := store.SpendEntry{Session: session, Route: c.cfg.Route, Purpose: "summary", Prompt: deref(u.PromptTokens),
		Completion: deref(u.CompletionTokens), CacheRead: deref(u.CacheReadTokens), CacheWrite: deref(u.CacheWriteTokens),
		CostUSD: resp.CostUSD, CostSource: resp.CostSource}
	if resp.Route != "" {
		e.Route = resp.Route
	}
	if err := c.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error { return tx.RecordSpend(e, 0) }); err != nil {
		c.cfg.Log.Warn("the summary's spend could not be recorded", "session", session, "error", err)
	}
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
