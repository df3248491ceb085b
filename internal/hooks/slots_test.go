package hooks

import (
	"encoding/json"
	"testing"
)

// Every slot of the registry describes itself fully (hooks.list and
// hooks.describe show it as it is), and every example input encodes.
func TestRegistryIsComplete(t *testing.T) {
	seen := map[string]bool{}
	kinds := map[Kind]int{}
	for _, s := range Slots() {
		if seen[s.Name] {
			t.Errorf("%s twice", s.Name)
		}
		seen[s.Name] = true
		kinds[s.Kind]++
		if s.Doc == "" || s.Input == "" || s.Output == "" || s.Failure == "" || s.Default == "" || s.Deadline <= 0 || s.DeadlineMS != s.Deadline.Milliseconds() {
			t.Errorf("%s is not fully described: %+v", s.Name, s)
		}
		if s.Kind == KindTransform && s.Fixture == nil {
			t.Errorf("transform %s has no example input", s.Name)
		}
		if s.Fixture != nil {
			if _, err := json.Marshal(s.Fixture); err != nil {
				t.Errorf("%s: %v", s.Name, err)
			}
		}
		if got, ok := Lookup(s.Name); !ok || got.Name != s.Name {
			t.Errorf("Lookup(%s)", s.Name)
		}
	}
	if kinds[KindDecision] != 9 || kinds[KindTransform] != 3 || kinds[KindObserver] != 7 {
		t.Errorf("kinds: %v", kinds)
	}
	// Only the two slots every release must bind are not optional.
	for _, s := range Slots() {
		if !s.Optional != (s.Name == SlotPlan || s.Name == SlotReview) {
			t.Errorf("%s optional=%v", s.Name, s.Optional)
		}
	}
}
