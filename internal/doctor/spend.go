package doctor

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
)

// checkSpend says how each route is counted against [spend]: in USD by its
// price, or in tokens only (a route without price whose provider does not
// report a cost), which a daily_usd or monthly_usd cap does not hold.
func checkSpend(f *config.File) Check {
	var unpriced []string
	for _, name := range slices.Sorted(maps.Keys(f.Routes)) {
		if f.Routes[name].Price == nil {
			unpriced = append(unpriced, name)
		}
	}
	s := f.Spend.Resolved()
	caps := spendCaps(s)
	c := Check{Name: "spend", OK: true}
	switch {
	case len(f.Routes) == 0:
		c.Detail = "no routes: nothing to count"
	case len(unpriced) == 0:
		c.Detail = fmt.Sprintf("every route has a price; caps: %s", caps)
	default:
		c.Warn = true
		c.Detail = fmt.Sprintf("route(s) %s have no price: their requests are counted in tokens only (unless the provider reports a cost), "+
			"so daily_usd and monthly_usd do not hold them; caps: %s", strings.Join(unpriced, ", "), caps)
		c.Fix = "set [routes.NAME] price = { input = …, output = … } (USD per million tokens), or [spend] daily_tokens"
	}
	return c
}

func spendCaps(s config.Spend) string {
	var parts []string
	if s.DailyUSD != nil {
		parts = append(parts, fmt.Sprintf("daily $%.2f", *s.DailyUSD))
	}
	if s.MonthlyUSD != nil {
		parts = append(parts, fmt.Sprintf("monthly $%.2f", *s.MonthlyUSD))
	}
	if s.DailyTokens > 0 {
		parts = append(parts, fmt.Sprintf("daily %d tokens", s.DailyTokens))
	}
	if len(parts) == 0 {
		return "none ([spend] sets none)"
	}
	return strings.Join(parts, ", ")
}
