package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Schedule is when a routine runs: once at At, every Every, or on a cron
// line read in the job's time zone. Deadlines are stored in UTC.
type Schedule struct {
	At    int64  `json:"at,omitempty"`    // unix ms
	Every int64  `json:"every,omitempty"` // ms
	Cron  string `json:"cron,omitempty"`  // "minute hour day-of-month month day-of-week"
}

// MinEvery is the shortest period a recurring job may have.
const MinEvery = time.Second

// Recurring reports whether the schedule fires more than once.
func (s Schedule) Recurring() bool { return s.Every > 0 || s.Cron != "" }

// Validate checks that exactly one form is set and that it parses.
func (s Schedule) Validate() error {
	n := 0
	for _, set := range []bool{s.At != 0, s.Every != 0, s.Cron != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("a schedule is exactly one of at=, every= or cron=")
	}
	if s.Every != 0 && time.Duration(s.Every)*time.Millisecond < MinEvery {
		return fmt.Errorf("every= must be at least %s", MinEvery)
	}
	if s.At < 0 {
		return errors.New("at= must be a time after 1970")
	}
	if s.Cron != "" {
		if _, err := parseCron(s.Cron); err != nil {
			return err
		}
	}
	return nil
}

// Next is the first deadline strictly after after. For a one-shot schedule
// it is At whenever At is after after, else zero.
func (s Schedule) Next(after time.Time, loc *time.Location) time.Time {
	switch {
	case s.At != 0:
		at := time.UnixMilli(s.At)
		if at.After(after) {
			return at
		}
		return time.Time{}
	case s.Every != 0:
		return after.Add(time.Duration(s.Every) * time.Millisecond)
	default:
		c, err := parseCron(s.Cron)
		if err != nil {
			return time.Time{}
		}
		return c.next(after, loc)
	}
}

// First is the first deadline of a new job created at now.
func (s Schedule) First(now time.Time, loc *time.Location) time.Time {
	if s.At != 0 {
		return time.UnixMilli(s.At) // a time already past is due now
	}
	return s.Next(now, loc)
}

// NextAfterRun is where a recurring job goes after a run that was due at
// due and ended at now: the next deadline after now, so that a long outage
// or a slow run fires once, never once per missed period.
func (s Schedule) NextAfterRun(due, now time.Time, loc *time.Location) time.Time {
	if s.Every != 0 {
		period := time.Duration(s.Every) * time.Millisecond
		next := due.Add(period)
		if !next.After(now) {
			// Keep the phase of the schedule: skip whole missed periods.
			missed := now.Sub(due) / period
			next = due.Add((missed + 1) * period)
		}
		return next
	}
	return s.Next(now, loc)
}

func decodeSchedule(raw json.RawMessage) (Schedule, error) {
	var s Schedule
	if len(raw) == 0 {
		return s, nil
	}
	err := json.Unmarshal(raw, &s)
	return s, err
}

// cron is a parsed five-field cron line: a bit set per field.
type cron struct {
	minute, hour, dom, month, dow uint64
	domStar, dowStar              bool
}

var cronFields = []struct {
	name     string
	min, max int
}{{"minute", 0, 59}, {"hour", 0, 23}, {"day of month", 1, 31}, {"month", 1, 12}, {"day of week", 0, 7}}

// MaxCronLen bounds a cron line.
const MaxCronLen = 200

func parseCron(line string) (cron, error) {
	var c cron
	if len(line) > MaxCronLen {
		return c, fmt.Errorf("cron= is longer than %d bytes", MaxCronLen)
	}
	fs := strings.Fields(line)
	if len(fs) != 5 {
		return c, fmt.Errorf("cron= %q: want five fields (minute hour day-of-month month day-of-week)", line)
	}
	sets := make([]uint64, 5)
	for i, f := range fs {
		def := cronFields[i]
		for _, part := range strings.Split(f, ",") {
			rng, stepS, hasStep := strings.Cut(part, "/")
			step := 1
			if hasStep {
				n, err := strconv.Atoi(stepS)
				if err != nil || n < 1 || n > def.max {
					return c, fmt.Errorf("cron= %q: bad step %q in the %s field", line, stepS, def.name)
				}
				step = n
			}
			lo, hi := def.min, def.max
			if rng != "*" {
				a, b, isRange := strings.Cut(rng, "-")
				var err1, err2 error
				lo, err1 = strconv.Atoi(a)
				hi = lo
				if isRange {
					hi, err2 = strconv.Atoi(b)
				} else if hasStep {
					hi = def.max
				}
				if err1 != nil || err2 != nil || lo < def.min || hi > def.max || lo > hi {
					return c, fmt.Errorf("cron= %q: %q is out of range in the %s field (%d-%d)", line, part, def.name, def.min, def.max)
				}
			}
			for v := lo; v <= hi; v += step {
				sets[i] |= 1 << uint(v)
			}
		}
	}
	if sets[4]&(1<<7) != 0 { // 7 is Sunday too
		sets[4] |= 1
	}
	c.minute, c.hour, c.dom, c.month, c.dow = sets[0], sets[1], sets[2], sets[3], sets[4]
	c.domStar, c.dowStar = fs[2] == "*", fs[4] == "*"
	return c, nil
}

func (c cron) dayMatches(t time.Time) bool {
	d := c.dom&(1<<uint(t.Day())) != 0
	w := c.dow&(1<<uint(t.Weekday())) != 0
	switch {
	case c.domStar && c.dowStar:
		return true
	case c.domStar:
		return w
	case c.dowStar:
		return d
	default:
		return d || w // cron's rule: either restricted day field matches
	}
}

// next finds the first minute after after, in loc, that the line matches.
// It searches at most five years ahead (a line such as "0 0 30 2 *" never matches).
func (c cron) next(after time.Time, loc *time.Location) time.Time {
	t := after.In(loc).Truncate(time.Minute).Add(time.Minute)
	limit := t.AddDate(5, 0, 0)
	for t.Before(limit) {
		if c.month&(1<<uint(t.Month())) == 0 {
			t = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, loc)
			continue
		}
		if !c.dayMatches(t) {
			t = time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, loc)
			continue
		}
		if c.hour&(1<<uint(t.Hour())) == 0 {
			t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour()+1, 0, 0, 0, loc)
			continue
		}
		if c.minute&(1<<uint(t.Minute())) == 0 {
			t = t.Add(time.Minute)
			continue
		}
		return t.UTC()
	}
	return time.Time{}
}
