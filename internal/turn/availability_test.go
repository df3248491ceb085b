package turn

import (
	"testing"
	"time"
)

// The backoff doubles per failure from ErrorBackoff, stays within its cap,
// and is jittered within the upper half of its step.
func TestBackoff(t *testing.T) {
	b := Budgets{ErrorBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for _, tc := range []struct {
		n        int
		min, max time.Duration
	}{
		{0, 50 * time.Millisecond, 100 * time.Millisecond},
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{5, 500 * time.Millisecond, time.Second},
		{60, 500 * time.Millisecond, time.Second},
		{100000, 500 * time.Millisecond, time.Second},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.backoff(tc.n)
			if d < tc.min || d > tc.max {
				t.Fatalf("backoff(%d) = %s, want %s..%s", tc.n, d, tc.min, tc.max)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("backoff(%d) has no jitter: %d distinct values in 200", tc.n, len(seen))
		}
	}
}
