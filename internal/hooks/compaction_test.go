package hooks

import (
	"strings"
	"testing"
)

// The host's reading of compaction.plan: it may pick a candidate, decline
// under the threshold path, or lower compact_at; it may not name a run it
// was not offered, decline over the hard budget, or raise the threshold.
func TestDecodeCompactionPlan(t *testing.T) {
	in := CompactionInput{Reason: "threshold", Need: 900, Threshold: 750, Budget: 1000, CompactAt: 0.75,
		Candidates: []CompactionCandidate{{Index: 0}, {Index: 1}}}
	over := in
	over.Reason, over.Need = "budget", 1200
	for _, tc := range []struct {
		name   string
		in     CompactionInput
		answer string
		choose int
		at     float64
		err    string
	}{
		{"oldest", in, `{"choose": 0, "reason": "r"}`, 0, 0, ""},
		{"another", in, `{"choose": 1}`, 1, 0, ""},
		{"not now", in, `{"choose": null}`, -1, 0, ""},
		{"earlier", in, `{"choose": 0, "compact_at": 0.5}`, 0, 0.5, ""},
		{"out of range", in, `{"choose": 2}`, 0, 0, "chose candidate 2"},
		{"negative", in, `{"choose": -1}`, 0, 0, "chose candidate -1"},
		{"decline over budget", over, `{"choose": null}`, 0, 0, "declined"},
		{"later", in, `{"choose": 0, "compact_at": 0.9}`, 0, 0, "outside"},
		{"not an object", in, `[1]`, 0, 0, "not {choose"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := decodeCompactionPlan(tc.in, []byte(tc.answer))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || p.Choose != tc.choose || p.CompactAt != tc.at {
				t.Fatalf("%+v %v", p, err)
			}
		})
	}
}
