package agents

import (
	"encoding/json"
	"strings"
	"testing"
)

// parseSpawn refuses a bad budget with the key's name and records a good
// one normalized (the budget package's Parse).
func TestParseSpawnBudget(t *testing.T) {
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
