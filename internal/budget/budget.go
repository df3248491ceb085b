// Package budget is a child agent's own budget: what a spawn's budget={...}
// or a profile's [budget] table asks for, checked the same way for both.
package budget

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Budget is one child's own budget: what a spawn's budget={...} (or a
// profile's [budget] table) asks for. A nil field does not bound. The job
// records it as given (normalized: only the keys set).
type Budget struct {
	// Tokens bounds the prompt+completion tokens of the child's model
	// requests, summed.
	Tokens *int64 `json:"tokens,omitempty" toml:"tokens"`
	// WallSeconds bounds the child's wall time since its spawn.
	WallSeconds *float64 `json:"wall_seconds,omitempty" toml:"wall_seconds"`
	// ModelRequests bounds the number of the child's model requests.
	ModelRequests *int64 `json:"model_requests,omitempty" toml:"model_requests"`
	// USD bounds the cost of the child's model requests, as the spend
	// ledger records them (the provider's reported cost, else the route's
	// price; an unpriced route adds nothing).
	USD *float64 `json:"usd,omitempty" toml:"usd"`
}

// Keys are the keys a budget takes, in their order.
var Keys = []string{"tokens", "wall_seconds", "model_requests", "usd"}

// Upper bounds of a budget's values (a typo of many zeros is refused
// rather than read as "unbounded").
const (
	MaxTokens      = 1_000_000_000_000
	MaxWallSeconds = 366 * 24 * 3600
	MaxRequests    = 1_000_000_000
	MaxUSD         = 1_000_000
)

// Parse decodes a budget object: exactly the keys tokens (int > 0),
// wall_seconds (number > 0), model_requests (int > 0) and usd (number > 0),
// each optional;
// null or empty is no budget. An error names the key ("budget.tokens: …").
func Parse(raw json.RawMessage) (Budget, error) {
	var b Budget
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return b, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return b, fmt.Errorf("budget is a dict of %s", strings.Join(Keys, ", "))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		switch k {
		case "tokens":
			n, err := positiveInt(v, MaxTokens)
			if err != nil {
				return Budget{}, fmt.Errorf("budget.tokens: %v", err)
			}
			b.Tokens = &n
		case "model_requests":
			n, err := positiveInt(v, MaxRequests)
			if err != nil {
				return Budget{}, fmt.Errorf("budget.model_requests: %v", err)
			}
			b.ModelRequests = &n
		case "wall_seconds":
			f, err := positiveNumber(v, MaxWallSeconds)
			if err != nil {
				return Budget{}, fmt.Errorf("budget.wall_seconds: %v", err)
			}
			b.WallSeconds = &f
		case "usd":
			f, err := positiveNumber(v, MaxUSD)
			if err != nil {
				return Budget{}, fmt.Errorf("budget.usd: %v", err)
			}
			b.USD = &f
		default:
			return Budget{}, fmt.Errorf("budget: %s is not a budget key; the keys are %s", clipKey(k), strings.Join(Keys, ", "))
		}
	}
	return b, nil
}

func positiveNumber(v json.RawMessage, limit float64) (float64, error) {
	var f float64
	if t := bytes.TrimSpace(v); len(t) == 0 || (t[0] != '-' && (t[0] < '0' || t[0] > '9')) || json.Unmarshal(t, &f) != nil {
		return 0, fmt.Errorf("must be a number > 0")
	}
	if math.IsNaN(f) || f <= 0 || f > limit {
		return 0, fmt.Errorf("must be a number > 0 and at most %d", int64(limit))
	}
	return f, nil
}

func positiveInt(v json.RawMessage, limit int64) (int64, error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, fmt.Errorf("must be an integer > 0") // json.Number would take "10" too
	}
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&n); err != nil {
		return 0, fmt.Errorf("must be an integer > 0")
	}
	i, err := n.Int64()
	if err != nil || i <= 0 || i > limit {
		return 0, fmt.Errorf("must be an integer > 0 and at most %d", limit)
	}
	return i, nil
}

func clipKey(k string) string {
	if len(k) > 40 {
		return fmt.Sprintf("%q (%d bytes)", k[:40], len(k))
	}
	return fmt.Sprintf("%q", k)
}

// Narrow returns the tighter of b and o, key by key: a key set in one only
// keeps that one's value; set in both, the smaller. (A profile's budget
// narrowed by a spawn's never grows.)
func (b Budget) Narrow(o Budget) Budget {
	return Budget{Tokens: minPtr(b.Tokens, o.Tokens), WallSeconds: minPtr(b.WallSeconds, o.WallSeconds),
		ModelRequests: minPtr(b.ModelRequests, o.ModelRequests), USD: minPtr(b.USD, o.USD)}
}

// IsZero reports whether b bounds nothing.
func (b Budget) IsZero() bool {
	return b.Tokens == nil && b.WallSeconds == nil && b.ModelRequests == nil && b.USD == nil
}

// JSON is b as the job records it ({} when it bounds nothing).
func (b Budget) JSON() json.RawMessage {
	out, _ := json.Marshal(b)
	return out
}

func minPtr[T int64 | float64](a, b *T) *T {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case *b < *a:
		return b
	}
	return a
}

// Check checks a budget read some other way than Parse (a profile's TOML):
// the same bounds, an error naming the key (prefix: where it was read).
func (b Budget) Check(prefix string) error {
	if b.Tokens != nil && (*b.Tokens <= 0 || *b.Tokens > MaxTokens) {
		return fmt.Errorf("%stokens = %d: must be an integer > 0 and at most %d", prefix, *b.Tokens, int64(MaxTokens))
	}
	if b.WallSeconds != nil && (math.IsNaN(*b.WallSeconds) || *b.WallSeconds <= 0 || *b.WallSeconds > MaxWallSeconds) {
		return fmt.Errorf("%swall_seconds = %v: must be a number > 0 and at most %d", prefix, *b.WallSeconds, MaxWallSeconds)
	}
	if b.ModelRequests != nil && (*b.ModelRequests <= 0 || *b.ModelRequests > MaxRequests) {
		return fmt.Errorf("%smodel_requests = %d: must be an integer > 0 and at most %d", prefix, *b.ModelRequests, int64(MaxRequests))
	}
	if b.USD != nil && (math.IsNaN(*b.USD) || *b.USD <= 0 || *b.USD > MaxUSD) {
		return fmt.Errorf("%susd = %v: must be a number > 0 and at most %d", prefix, *b.USD, int64(MaxUSD))
	}
	return nil
}
