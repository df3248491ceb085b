package hooks

import (
	"slices"
	"testing"
)

// The host default orders as the shipped attention.plan does (its Python
// test, behavior/tests/test_attention.py, has the same case): operator
// first, then directed, then ambient once due; conversations take turns.
func TestDefaultPlanConversationsTakeTurns(t *testing.T) {
	const now = 1_700_000_000.0
	item := func(id int64, kind string, directed bool, age float64, conv string) PlanItem {
		return PlanItem{ID: id, SourceKind: kind, Directed: directed, Conversation: conv, ReceivedAt: now - age}
	}
	in := PlanInput{Now: now, Items: []PlanItem{
		item(1, "discord", false, 60, "busy"), item(2, "discord", false, 59, "busy"),
		item(3, "discord", false, 58, "busy"), item(4, "discord", false, 30, "quiet"),
		item(5, "discord", true, 20, "dm-a"), item(6, "discord", true, 19, "dm-a"),
		item(7, "discord", true, 10, "dm-b"),
		item(8, "discord", false, 2, "quiet"), // ambient, not yet due
		item(9, "operator", true, 1, "operator"),
	}}
	p := DefaultPlan(in)
	if want := []int64{9, 5, 7, 6, 1, 4, 2, 3}; !slices.Equal(p.Order, want) {
		t.Fatalf("order %v, want %v", p.Order, want)
	}
	if len(p.Defer) != 1 || p.Defer[0].ID != 8 || p.Defer[0].Until != now-2+AmbientDefer {
		t.Fatalf("defer %+v", p.Defer)
	}
	if err := validatePlan(in, p); err != nil {
		t.Fatalf("the default does not pass the host's own check: %v", err)
	}
}
