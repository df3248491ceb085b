package provider

import (
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, in string
		want     time.Duration
	}{
		{"seconds", "7", 7 * time.Second},
		{"seconds with spaces", " 30 ", 30 * time.Second},
		{"zero", "0", 0},
		{"negative", "-5", 0},
		{"huge seconds", "99999999999999", maxRetryAfter},
		{"http date", "Tue, 01 Dec 2026 12:01:30 GMT", 90 * time.Second},
		{"http date in the past", "Tue, 01 Dec 2026 11:00:00 GMT", 0},
		{"http date far ahead", "Fri, 01 Jan 2100 00:00:00 GMT", maxRetryAfter},
		{"garbage", "soon", 0},
		{"fraction", "1.5", 0},
		{"empty", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseRetryAfter(tc.in, now); got != tc.want {
				t.Fatalf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	f.Add("120")
	f.Add("Tue, 01 Dec 2026 12:01:30 GMT")
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := parseRetryAfter(v, now); d < 0 || d > maxRetryAfter {
			t.Fatalf("parseRetryAfter(%q) = %s, outside 0..%s", v, d, maxRetryAfter)
		}
	})
}
