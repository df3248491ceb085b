package hooks

import (
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/jobs"
)

// job.plan's answer may choose the host; an empty, overlong or non-UTF-8
// host is an invalid answer (the host default applies), and no host key
// (or null) leaves the job where it asked to run.
func TestDecodeJobPlanHost(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		host         string // "" with ok: no choice
		err          string
	}{
		{name: "no host", answer: `{"admit": true, "priority": 3, "reason": "r"}`},
		{name: "null host", answer: `{"admit": true, "priority": 0, "reason": "r", "host": null}`},
		{name: "a host", answer: `{"admit": true, "priority": 0, "reason": "big", "host": "gpu"}`, host: "gpu"},
		{name: "a label", answer: `{"admit": true, "priority": 0, "reason": "big", "host": "label:gpu"}`, host: "label:gpu"},
		{name: "empty", answer: `{"admit": true, "priority": 0, "reason": "r", "host": ""}`, err: "job.plan gave host"},
		{name: "overlong", answer: `{"admit": true, "priority": 0, "reason": "r", "host": "` + strings.Repeat("h", MaxPlanHost+1) + `"}`, err: "job.plan gave host"},
		{name: "not a string", answer: `{"admit": true, "priority": 0, "reason": "r", "host": 3}`, err: "not {admit, priority, reason[, host]}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p jobs.Plan
			err := decodeJobPlan([]byte(tc.answer), &p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%s: %+v %v, want an error with %q", tc.answer, p, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.host == "" && p.Host != nil:
				t.Fatalf("host %q, want none", *p.Host)
			case tc.host != "" && (p.Host == nil || *p.Host != tc.host):
				t.Fatalf("host %v, want %q", p.Host, tc.host)
			}
		})
	}
}
