package budget

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	b, err := Parse(json.RawMessage(`{"tokens": 10000, "wall_seconds": 1.5, "model_requests": 3}`))
	if err != nil || *b.Tokens != 10000 || *b.WallSeconds != 1.5 || *b.ModelRequests != 3 {
		t.Fatalf("%+v, %v", b, err)
	}
	if got := string(b.JSON()); got != `{"tokens":10000,"wall_seconds":1.5,"model_requests":3}` {
		t.Fatalf("recorded as %s", got)
	}
	for _, raw := range []string{``, `null`, `{}`, ` {} `} {
		if b, err := Parse(json.RawMessage(raw)); err != nil || !b.IsZero() || string(b.JSON()) != "{}" {
			t.Fatalf("%q: %+v, %v", raw, b, err)
		}
	}
	for _, c := range []struct{ raw, want string }{
		{`{"tokens": 0}`, "budget.tokens: must be an integer > 0"},
		{`{"tokens": -5}`, "budget.tokens"},
		{`{"tokens": 1.5}`, "budget.tokens"},
		{`{"tokens": "10"}`, "budget.tokens"},
		{`{"tokens": null}`, "budget.tokens"},
		{`{"tokens": 1e13}`, "budget.tokens"},
		{`{"model_requests": 0}`, "budget.model_requests"},
		{`{"model_requests": true}`, "budget.model_requests"},
		{`{"wall_seconds": 0}`, "budget.wall_seconds: must be a number > 0"},
		{`{"wall_seconds": -1}`, "budget.wall_seconds"},
		{`{"wall_seconds": "1"}`, "budget.wall_seconds"},
		{`{"wall_seconds": null}`, "budget.wall_seconds"},
		{`{"wall_seconds": 1e9}`, "budget.wall_seconds"},
		{`{"tokens": 5, "cost": 3}`, `budget: "cost" is not a budget key; the keys are tokens, wall_seconds, model_requests`},
		{`{"usd": 0}`, "budget.usd: must be a number > 0"},
		{`{"usd": -0.5}`, "budget.usd"},
		{`{"usd": "1"}`, "budget.usd"},
		{`{"usd": 1e7}`, "budget.usd"},
		{`[1]`, "budget is a dict"},
		{`"big"`, "budget is a dict"},
	} {
		if _, err := Parse(json.RawMessage(c.raw)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.raw, err, c.want)
		}
	}
}

// Narrow keeps the tighter value of each key; a key set on one side only
// keeps that side's.
func TestUSD(t *testing.T) {
	b, err := Parse(json.RawMessage(`{"usd": 0.1, "tokens": 50}`))
	if err != nil || *b.USD != 0.1 || string(b.JSON()) != `{"tokens":50,"usd":0.1}` {
		t.Fatalf("%+v, %v", b, err)
	}
	f := func(n float64) *float64 { return &n }
	if got := (Budget{USD: f(0.5)}).Narrow(Budget{USD: f(0.1)}); *got.USD != 0.1 || got.IsZero() {
		t.Fatalf("narrowed %s", got.JSON())
	}
	if err := (Budget{USD: f(-1)}).Check("profile x budget."); err == nil || !strings.Contains(err.Error(), "profile x budget.usd") {
		t.Fatalf("check: %v", err)
	}
}

func TestNarrow(t *testing.T) {
	i := func(n int64) *int64 { return &n }
	f := func(n float64) *float64 { return &n }
	profile := Budget{Tokens: i(1000), WallSeconds: f(60)}
	spawn := Budget{Tokens: i(5000), ModelRequests: i(4)}
	got := profile.Narrow(spawn)
	if *got.Tokens != 1000 || *got.WallSeconds != 60 || *got.ModelRequests != 4 {
		t.Fatalf("narrowed %s", got.JSON())
	}
	if got := spawn.Narrow(profile); string(got.JSON()) != string(profile.Narrow(spawn).JSON()) {
		t.Fatalf("not symmetric: %s", got.JSON())
	}
	if got := (Budget{}).Narrow(Budget{}); !got.IsZero() {
		t.Fatalf("%s", got.JSON())
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"tokens":10,"wall_seconds":2.5,"model_requests":1}`))
	f.Add([]byte(`{"tokens":1e3}`))
	f.Add([]byte(`{"x":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := Parse(raw)
		if err != nil {
			return
		}
		if b.Tokens != nil && (*b.Tokens <= 0 || *b.Tokens > MaxTokens) ||
			b.ModelRequests != nil && (*b.ModelRequests <= 0 || *b.ModelRequests > MaxRequests) ||
			b.WallSeconds != nil && (!(*b.WallSeconds > 0) || *b.WallSeconds > MaxWallSeconds) {
			t.Fatalf("accepted out of bounds: %s", b.JSON())
		}
		again, err := Parse(b.JSON())
		if err != nil || string(again.JSON()) != string(b.JSON()) {
			t.Fatalf("%s does not read back: %v", b.JSON(), err)
		}
	})
}

func TestCheck(t *testing.T) {
	i := func(n int64) *int64 { return &n }
	f := func(x float64) *float64 { return &x }
	if err := (Budget{Tokens: i(5), WallSeconds: f(1.5), ModelRequests: i(2)}).Check("[budget] "); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b    Budget
		want string
	}{
		{Budget{Tokens: i(0)}, "[budget] tokens = 0"},
		{Budget{Tokens: i(MaxTokens + 1)}, "[budget] tokens"},
		{Budget{WallSeconds: f(-1)}, "[budget] wall_seconds = -1"},
		{Budget{WallSeconds: f(MaxWallSeconds + 1)}, "[budget] wall_seconds"},
		{Budget{ModelRequests: i(-3)}, "[budget] model_requests = -3"},
	} {
		if err := c.b.Check("[budget] "); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.b.JSON(), err, c.want)
		}
	}
}
