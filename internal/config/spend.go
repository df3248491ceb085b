package config

import (
	"fmt"
	"time"
)

// Price is a route's price = { input, output, cache_read, cache_write }
// in USD per million tokens. Input and output are required; cache_read
// and cache_write default to input (a route that does not discount its
// cache is priced as if it had none).
type Price struct {
	Input      *float64 `toml:"input"`
	Output     *float64 `toml:"output"`
	CacheRead  *float64 `toml:"cache_read"`
	CacheWrite *float64 `toml:"cache_write"`
}

// MaxPricePerMillion bounds a price (a typo of many zeros is refused).
const MaxPricePerMillion = 10_000

// Rates is a Price with its defaults filled in, USD per million tokens.
type Rates struct {
	Input, Output, CacheRead, CacheWrite float64
}

// Rates returns p with cache_read and cache_write defaulted to input.
func (p Price) Rates() Rates {
	r := Rates{Input: deref(p.Input), Output: deref(p.Output)}
	r.CacheRead, r.CacheWrite = r.Input, r.Input
	if p.CacheRead != nil {
		r.CacheRead = *p.CacheRead
	}
	if p.CacheWrite != nil {
		r.CacheWrite = *p.CacheWrite
	}
	return r
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// Spend is the [spend] section: caps on what all model requests of the
// agent cost, by day and by month in TimeZone. A nil cap does not bound.
type Spend struct {
	DailyUSD   *float64 `toml:"daily_usd"`
	MonthlyUSD *float64 `toml:"monthly_usd"`
	// DailyTokens bounds the prompt+completion tokens of a day: the cap
	// that holds routes without a price.
	DailyTokens int64 `toml:"daily_tokens"`
	// WarnAt is the share of a cap past which one notice is written and a
	// metric set. Default 0.8.
	WarnAt float64 `toml:"warn_at"`
	// TimeZone names the zone whose midnight ends a day (IANA name, e.g.
	// "Europe/Berlin"); empty: the host's local time.
	TimeZone string `toml:"time_zone"`
}

// Defaults and bounds of [spend].
const (
	DefaultSpendWarnAt = 0.8
	MaxSpendUSD        = 1_000_000
	MaxSpendTokens     = 1_000_000_000_000
)

// Resolved returns s with warn_at at its default when omitted.
func (s Spend) Resolved() Spend {
	if s.WarnAt == 0 {
		s.WarnAt = DefaultSpendWarnAt
	}
	return s
}

// Location is the time zone of the caps' periods.
func (s Spend) Location() (*time.Location, error) {
	if s.TimeZone == "" {
		return time.Local, nil
	}
	return time.LoadLocation(s.TimeZone)
}

// price checks a route's price.
func (v *validator) price(section string, p *Price) {
	if p == nil {
		return
	}
	key := section + ".price"
	for _, f := range []struct {
		name     string
		val      *float64
		required bool
	}{{"input", p.Input, true}, {"output", p.Output, true}, {"cache_read", p.CacheRead, false}, {"cache_write", p.CacheWrite, false}} {
		switch {
		case f.val == nil && f.required:
			v.fail(key+"."+f.name, "required: USD per million tokens (0 for a free route)", key, section)
		case f.val != nil && !(*f.val >= 0 && *f.val <= MaxPricePerMillion):
			v.fail(key+"."+f.name, fmt.Sprintf("%v is out of range 0..%d (USD per million tokens)", *f.val, MaxPricePerMillion), key, section)
		}
	}
}

// spend checks the [spend] section.
func (v *validator) spend(given *Spend) {
	s := given.Resolved()
	for _, c := range []struct {
		key string
		val *float64
	}{{"spend.daily_usd", s.DailyUSD}, {"spend.monthly_usd", s.MonthlyUSD}} {
		if c.val != nil && !(*c.val > 0 && *c.val <= MaxSpendUSD) {
			v.fail(c.key, fmt.Sprintf("%v is out of range: more than 0, at most %d; leave it out for no cap", *c.val, MaxSpendUSD), "spend")
		}
	}
	if s.DailyTokens < 0 || s.DailyTokens > MaxSpendTokens || (s.DailyTokens == 0 && v.index.has("spend.daily_tokens")) {
		v.fail("spend.daily_tokens", fmt.Sprintf("%d is out of range 1..%d; leave it out for no cap", s.DailyTokens, int64(MaxSpendTokens)), "spend")
	}
	if !(s.WarnAt > 0 && s.WarnAt <= 1) {
		v.fail("spend.warn_at", fmt.Sprintf("%v is out of range: more than 0, at most 1 (a share of each cap)", s.WarnAt), "spend")
	}
	if _, err := s.Location(); err != nil || len(s.TimeZone) > 64 {
		v.fail("spend.time_zone", fmt.Sprintf("%q is not a time zone this host knows (an IANA name such as Europe/Berlin, or UTC)", clip(s.TimeZone, 64)), "spend")
	}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
