package spend

import (
	"context"
	"fmt"

	"github.com/klbr-dev/klbr/internal/provider"
)

// Wrap returns c with every request metered: reserved before it starts
// (waiting at a cap), settled with its reported usage, and its cost set on
// the response (Response.CostUSD, CostSource) for the ledger row its
// caller commits.
func (m *Meter) Wrap(route string, c provider.Completer) provider.Completer {
	return &metered{m: m, route: route, c: c}
}

type metered struct {
	m     *Meter
	route string
	c     provider.Completer
}

func (w *metered) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	purpose := req.Meta.Purpose
	if purpose == "" {
		purpose = "turn"
	}
	res, err := w.m.Reserve(ctx, req.Meta.Session, w.route, EstimatePrompt(req), req.MaxTokens)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", provider.ErrNotSent, err)
	}
	resp, err := w.c.Complete(ctx, req)
	var usd *float64
	tokens := 0
	if resp != nil {
		var src string
		usd, src = w.m.opts.Prices.Cost(w.route, resp.Usage)
		resp.CostUSD, resp.CostSource = usd, src
		tokens = n(resp.Usage.PromptTokens) + n(resp.Usage.CompletionTokens)
	}
	res.Settle(w.route, purpose, usd, tokens)
	return resp, err
}

// EstimatePrompt is a request's prompt size in tokens, by the usual four
// bytes a token, counted without encoding it.
func EstimatePrompt(req provider.Request) int {
	b := 0
	for _, m := range req.Messages {
		b += len(m.Content) + len(m.Role) + 8
		for _, c := range m.ToolCalls {
			b += len(c.Function.Name) + len(c.Function.Arguments) + len(c.ID) + 16
		}
		if m.Reasoning != nil {
			b += len(m.Reasoning.Text) + len(m.Reasoning.Details)
		}
		b += len(m.Extra)
	}
	for _, t := range req.Tools {
		b += len(t.Function.Name) + len(t.Function.Description) + len(t.Function.Parameters) + 16
	}
	return b/4 + 1
}
