package agents

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseBudget(t *testing.T) {
	b, err := ParseBudget(json.RawMessage(`{"tokens": 10000, "wall_seconds": 1.5, "model_requests": 3}`))
	if err != nil || *b.Tokens != 10000 || *b.WallSeconds != 1.5 || *b.ModelRequests != 3 {
		t.Fatalf("%+v, %v", b, err)
	}
	if got := string(b.JSON()); got != `{"tokens":10000,"wall_seconds":1.5,"model_requests":3}` {
		t.Fatalf("recorded as %s", got)
	}
	for _, raw := range []string{``, `null`, `{}`, ` {} `} {
		if b, err := ParseBudget(json.RawMessage(raw)); err != nil || !b.IsZero() || string(b.JSON()) != "{}" {
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
		{`[1]`, "budget is a dict"},
		{`"big"`, "budget is a dict"},
	} {
		if _, err := ParseBudget(json.RawMessage(c.raw)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.raw, err, c.want)
		}
	}
	// parseSpawn refuses with the key's name and records the budget normalized.
	if _, err := parseSpawn(json.RawMessage(`{"task":"x","budget":{"tokns":5}}`)); code(err) != "invalid" || !strings.Contains(err.Error(), `"tokns" is not a budget key`) {
		t.Fatalf("spawn with a misspelled key: %v", err)
	}
	if a, err := parseSpawn(json.RawMessage(`{"task":"x","budget":{"model_requests":2.0e0, "tokens": 7}}`)); err == nil || code(err) != "invalid" {
		// 2.0e0 is not an integer literal: refused like 1.5.
		t.Fatalf("spawn: %+v, %v", a, err)
	}
	if a, err := parseSpawn(json.RawMessage(`{"task":"x","budget":{"tokens": 7}}`)); err != nil || string(a.Budget) != `{"tokens":7}` {
		t.Fatalf("spawn: %s, %v", a.Budget, err)
	}
}

// Narrow keeps the tighter value of each key; a key set on one side only
// keeps that side's.
func TestBudgetNarrow(t *testing.T) {
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

func FuzzParseBudget(f *testing.F) {
	f.Add([]byte(`{"tokens":10,"wall_seconds":2.5,"model_requests":1}`))
	f.Add([]byte(`{"tokens":1e3}`))
	f.Add([]byte(`{"x":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := ParseBudget(raw)
		if err != nil {
			return
		}
		if b.Tokens != nil && (*b.Tokens <= 0 || *b.Tokens > MaxBudgetTokens) ||
			b.ModelRequests != nil && (*b.ModelRequests <= 0 || *b.ModelRequests > MaxBudgetRequests) ||
			b.WallSeconds != nil && (!(*b.WallSeconds > 0) || *b.WallSeconds > MaxBudgetWallSeconds) {
			t.Fatalf("accepted out of bounds: %s", b.JSON())
		}
		again, err := ParseBudget(b.JSON())
		if err != nil || string(again.JSON()) != string(b.JSON()) {
			t.Fatalf("%s does not read back: %v", b.JSON(), err)
		}
	})
}
