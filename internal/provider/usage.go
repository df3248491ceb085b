package provider

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// parseUsage reads a usage object, and llama.cpp's timings beside it (its
// cache_n is the prompt tokens it took from its cache, reported when usage
// has no prompt_tokens_details). Fields that are absent, null or not a
// non-negative integer stay nil.
func parseUsage(raw, timings json.RawMessage) Usage {
	var u Usage
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil || top == nil {
		return u
	}
	var details map[string]json.RawMessage
	if d, ok := top["prompt_tokens_details"]; ok {
		_ = json.Unmarshal(d, &details)
	}
	u.PromptTokens = optInt(top["prompt_tokens"])
	u.CompletionTokens = optInt(top["completion_tokens"])
	u.TotalTokens = optInt(top["total_tokens"])
	u.CacheReadTokens = optInt(details["cached_tokens"])
	if u.CacheReadTokens == nil {
		u.CacheReadTokens = optInt(top["prompt_cache_hit_tokens"])
	}
	u.CacheWriteTokens = optInt(details["cache_write_tokens"])
	if u.CacheWriteTokens == nil {
		u.CacheWriteTokens = optInt(top["cache_write_tokens"])
	}
	u.CacheMissTokens = optInt(top["prompt_cache_miss_tokens"])
	u.CostUSD = optCost(top["cost"])
	if u.CacheReadTokens == nil && len(timings) > 0 {
		var t map[string]json.RawMessage
		if json.Unmarshal(timings, &t) == nil {
			u.CacheReadTokens = optInt(t["cache_n"])
		}
	}
	return u
}

// optInt returns the non-negative integer raw holds (12 or 12.0), else nil.
func optInt(raw json.RawMessage) *int {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' || raw[0] == '"' {
		return nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return nil
	}
	if i, err := strconv.ParseInt(string(n), 10, 0); err == nil {
		if i < 0 {
			return nil
		}
		v := int(i)
		return &v
	}
	f, err := n.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		return nil
	}
	v := int(f)
	return &v
}

// MaxReportedCostUSD bounds a reported cost: a larger figure is taken for
// garbage (not reported) rather than stop every request at a cap.
const MaxReportedCostUSD = 10_000

// optCost returns the finite non-negative number of USD raw holds (at most
// MaxReportedCostUSD), else nil.
func optCost(raw json.RawMessage) *float64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return nil
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || !(f >= 0 && f <= MaxReportedCostUSD) {
		return nil
	}
	return &f
}
