package jobs

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones are in the test binary: the test never depends on the machine's zoneinfo
)

func TestCronNextInItsTimeZone(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line  string
		loc   *time.Location
		after time.Time
		want  time.Time
	}{
		// 07:00 on weekdays, Berlin: Friday 2026-12-04 after 07:00 → Monday 2026-12-07 07:00 CET (06:00 UTC).
		{"0 7 * * 1-5", berlin, time.Date(2026, 12, 4, 7, 0, 0, 0, berlin), time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)},
		// The day Berlin springs forward (2027-03-28): 03:30 is CEST, 01:30 UTC.
		{"30 3 * * *", berlin, time.Date(2027, 3, 27, 12, 0, 0, 0, berlin), time.Date(2027, 3, 28, 1, 30, 0, 0, time.UTC)},
		{"*/15 * * * *", time.UTC, time.Date(2026, 12, 2, 10, 7, 30, 0, time.UTC), time.Date(2026, 12, 2, 10, 15, 0, 0, time.UTC)},
		// Day of month and day of week both restricted: either matches (cron's rule).
		{"0 0 1 * 0", time.UTC, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)},
		{"0 0 29 2 *", time.UTC, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)},
	} {
		s := Schedule{Cron: tc.line}
		if err := s.Validate(); err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if got := s.Next(tc.after, tc.loc); !got.Equal(tc.want) {
			t.Errorf("%q after %v: %v, want %v", tc.line, tc.after, got, tc.want)
		}
	}
	if (Schedule{Cron: "0 0 30 2 *"}).Next(time.Now(), time.UTC) != (time.Time{}) {
		t.Error("a line that never matches has a next deadline")
	}
}

func TestEveryKeepsItsPhaseAfterAnOutage(t *testing.T) {
	s := Schedule{Every: 60_000}
	due := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	// Ran on time: the next period.
	if got := s.NextAfterRun(due, due.Add(2*time.Second), time.UTC); !got.Equal(due.Add(time.Minute)) {
		t.Fatalf("on time: %v", got)
	}
	// Ran after a 3 h 10.5 min outage: once, then the next boundary of the schedule.
	now := due.Add(3*time.Hour + 10*time.Minute + 30*time.Second)
	if got := s.NextAfterRun(due, now, time.UTC); !got.Equal(due.Add(3*time.Hour + 11*time.Minute)) {
		t.Fatalf("after the outage: %v", got)
	}
	// A one-shot in the past is due at once when created, and never again after its run.
	at := Schedule{At: due.UnixMilli()}
	if got := at.First(due.Add(time.Hour), time.UTC); !got.Equal(due) {
		t.Fatalf("first of a past one-shot: %v", got)
	}
	if at.Recurring() || !at.Next(due.Add(time.Hour), time.UTC).IsZero() {
		t.Fatal("a one-shot fires again")
	}
}
