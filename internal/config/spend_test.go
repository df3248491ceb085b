package config

import (
	"strings"
	"testing"
)

func TestParseSpendRefuses(t *testing.T) {
	tests := []struct {
		name, doc, key, msg string
	}{
		{"negative input price", base + "price = { input = -0.1, output = 1 }\n", "routes.main.price.input", "out of range"},
		{"NaN output price", base + "price = { input = 0.1, output = nan }\n", "routes.main.price.output", "out of range"},
		{"infinite cache_read price", base + "price = { input = 0.1, output = 1, cache_read = inf }\n", "routes.main.price.cache_read", "out of range"},
		{"price without output", base + "price = { input = 0.1 }\n", "routes.main.price.output", "required"},
		{"unknown price key", base + "price = { input = 0.1, output = 1, cached = 0.01 }\n", "cached", "unknown key"},
		{"price as a number", base + "price = 0.27\n", "routes.main.price", "expected"},
		{"daily_usd zero", "[spend]\ndaily_usd = 0\n", "spend.daily_usd", "out of range"},
		{"monthly_usd negative", "[spend]\nmonthly_usd = -5\n", "spend.monthly_usd", "out of range"},
		{"monthly_usd NaN", "[spend]\nmonthly_usd = nan\n", "spend.monthly_usd", "out of range"},
		{"daily_tokens zero", "[spend]\ndaily_tokens = 0\n", "spend.daily_tokens", "out of range"},
		{"warn_at above one", "[spend]\nwarn_at = 1.5\n", "spend.warn_at", "out of range"},
		{"unknown time zone", "[spend]\ntime_zone = \"Mars/Olympus\"\n", "spend.time_zone", "not a time zone"},
		{"unknown spend key", "[spend]\nweekly_usd = 3\n", "spend.weekly_usd", "unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("klbr.toml", []byte(tt.doc))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			errs := Errors(err)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), err)
			}
			if e := errs[0]; (e.Key != tt.key && !strings.HasSuffix(e.Key, tt.key)) || !strings.Contains(e.Msg, tt.msg) || e.Line < 1 {
				t.Errorf("got %v (key %q), want key %q and %q", e, e.Key, tt.key, tt.msg)
			}
		})
	}
}

func TestParseSpendAccepts(t *testing.T) {
	doc := base + "price = { input = 0.27, output = 1.10, cache_read = 0.07 }\n\n[spend]\ndaily_usd = 5\nmonthly_usd = 50.5\ndaily_tokens = 2000000\ntime_zone = \"Europe/Berlin\"\n"
	f, err := Parse("klbr.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	r := f.Routes["main"].Price.Rates()
	if r != (Rates{Input: 0.27, Output: 1.10, CacheRead: 0.07, CacheWrite: 0.27}) {
		t.Errorf("rates = %+v; cache_write defaults to input", r)
	}
	s := f.Spend.Resolved()
	if *s.DailyUSD != 5 || *s.MonthlyUSD != 50.5 || s.DailyTokens != 2000000 || s.WarnAt != DefaultSpendWarnAt {
		t.Errorf("spend = %+v", s)
	}
	if loc, _ := s.Location(); loc.String() != "Europe/Berlin" {
		t.Errorf("location = %v", loc)
	}
	if f, err := Parse("klbr.toml", []byte(base)); err != nil || f.Routes["main"].Price != nil || f.Spend.DailyUSD != nil {
		t.Errorf("no price and no caps by default: %+v, %v", f.Routes["main"].Price, err)
	}
}
