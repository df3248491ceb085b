package spend

import "github.com/klbr-dev/klbr/internal/config"

// Reconfigure puts a reloaded [spend] in force: the daily and monthly USD
// caps (the operator's, from overrides, still win over the file), the
// daily token cap and warn_at. Waiters look again at once. The time zone
// and the routes' prices stay as they were at the start (a restart
// applies them).
func (m *Meter) Reconfigure(s config.Spend, overrides map[string]float64) {
	s = s.Resolved()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.daily, m.monthly = s.DailyUSD, s.MonthlyUSD
	if v, ok := overrides["daily"]; ok {
		m.daily = &v
	}
	if v, ok := overrides["monthly"]; ok {
		m.monthly = &v
	}
	m.opts.Spend.DailyTokens, m.opts.Spend.WarnAt = s.DailyTokens, s.WarnAt
	m.wake()
}
