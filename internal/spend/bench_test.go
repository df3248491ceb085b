package spend

import (
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/provider"
)

// BenchmarkReserveSettle is the meter's work per request: the prompt's
// estimate, a reservation against three caps, the cost and the settlement.
func BenchmarkReserveSettle(b *testing.B) {
	m, err := New(b.Context(), Options{Spend: config.Spend{DailyUSD: fp(1e6), MonthlyUSD: fp(1e6), DailyTokens: 1e12, TimeZone: "UTC"}, Prices: dollar})
	if err != nil {
		b.Fatal(err)
	}
	req := provider.Request{Messages: make([]provider.Message, 200), MaxTokens: 4096}
	for i := range req.Messages {
		req.Messages[i] = provider.Message{Role: "user", Content: "some message of a long session"}
	}
	u := usage(20_000, 500)
	for b.Loop() {
		r, err := m.Reserve(b.Context(), "s", "paid", EstimatePrompt(req), req.MaxTokens)
		if err != nil {
			b.Fatal(err)
		}
		c, _ := m.opts.Prices.Cost("paid", u)
		r.Settle("paid", "turn", c, 20_500)
	}
}
