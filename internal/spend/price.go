// Package spend is what model requests cost and the caps that bound it:
// each request's cost by its provider's report or its route's price, and
// the Meter that reserves a request's largest cost against the daily and
// monthly caps before it starts and settles it with the reported usage.
package spend

import (
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// Prices are the routes' rates by name; a route without an entry has no
// price (it is counted in tokens only).
type Prices map[string]config.Rates

// PricesOf reads the prices of f's routes.
func PricesOf(f *config.File) Prices {
	p := Prices{}
	for name, r := range f.Routes {
		if r.Price != nil {
			p[name] = r.Price.Rates()
		}
	}
	return p
}

// Cost is a request's cost: the provider's reported figure, else the
// route's price applied to the reported usage, else none (nil, CostNone).
// Cache reads and writes are priced at their rates and taken out of the
// prompt tokens (providers count them inside prompt_tokens).
func (p Prices) Cost(route string, u provider.Usage) (*float64, string) {
	if u.CostUSD != nil {
		c := *u.CostUSD
		return &c, store.CostReported
	}
	r, ok := p[route]
	if !ok {
		return nil, store.CostNone
	}
	prompt, read, write, out := n(u.PromptTokens), n(u.CacheReadTokens), n(u.CacheWriteTokens), n(u.CompletionTokens)
	plain := max(prompt-read-write, 0)
	c := (float64(plain)*r.Input + float64(read)*r.CacheRead + float64(write)*r.CacheWrite + float64(out)*r.Output) / 1e6
	return &c, store.CostPrice
}

// Bound is the largest cost of a request of prompt tokens and at most
// maxOut answer tokens on route (prompt at the dearer of input and cache
// write), 0 for a route without a price.
func (p Prices) Bound(route string, prompt, maxOut int) float64 {
	r, ok := p[route]
	if !ok {
		return 0
	}
	return (float64(prompt)*max(r.Input, r.CacheWrite) + float64(maxOut)*r.Output) / 1e6
}

func n(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
