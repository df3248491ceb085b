package spend

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// ledgerStore is a real store whose clock the test moves, holding two
// days of spend in two routes.
func ledgerStore(t testing.TB) (*store.Store, time.Time) {
	t.Helper()
	var mu sync.Mutex
	now := time.Date(2026, 5, 10, 23, 30, 0, 0, time.UTC)
	day1 := now
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{Clock: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	write := func(f func(tx *store.Tx) error) {
		if err := st.Write(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
	write(func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err })
	write(func(tx *store.Tx) error {
		return tx.RecordSpend(store.SpendEntry{Session: "default", Route: "paid", Purpose: "turn", Prompt: 100, Completion: 10, CostUSD: fp(0.5), CostSource: store.CostPrice}, 0)
	})
	mu.Lock()
	now = now.Add(time.Hour) // the next day in UTC
	mu.Unlock()
	write(func(tx *store.Tx) error {
		if err := tx.RecordSpend(store.SpendEntry{Session: "default", Route: "paid", Purpose: "summary", Prompt: 50, CostUSD: fp(0.25), CostSource: store.CostReported}, 0); err != nil {
			return err
		}
		return tx.RecordSpend(store.SpendEntry{Session: "default", Route: "local", Purpose: "turn", Prompt: 7, Completion: 3}, 0)
	})
	return st, day1
}

func summary(t *testing.T, o *Ops, args string) (Summary, error) {
	t.Helper()
	raw, err := o.HandleRequest(t.Context(), worker.Request{Op: "spend.summary", Args: json.RawMessage(args)})
	var s Summary
	if err == nil {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
	}
	return s, err
}

// spend.summary is klbr-core spend's view for a cell: grouped by day in
// the caps' zone, route or purpose, from since on, with the caps' state;
// bad arguments are the cell's error, and nothing else is a spend op.
func TestSummaryOp(t *testing.T) {
	st, day1 := ledgerStore(t)
	m, err := New(t.Context(), Options{Spend: config.Spend{DailyUSD: fp(2), TimeZone: "UTC"}, Now: func() time.Time { return day1 }})
	if err != nil {
		t.Fatal(err)
	}
	o := NewOps(st, time.UTC, m)
	got := func(s Summary) map[string]float64 {
		out := map[string]float64{}
		for _, g := range s.Groups {
			out[g.Key] = g.USD
		}
		return out
	}
	s, err := summary(t, o, `{}`)
	if err != nil || s.By != "day" || s.Total.USD != 0.75 || s.Total.Requests != 3 || s.Total.Unpriced != 1 ||
		len(s.Groups) != 2 || got(s)["2026-05-10"] != 0.5 || got(s)["2026-05-11"] != 0.25 {
		t.Fatalf("by day: %+v, %v", s, err)
	}
	if s.State == nil || s.State.DailyUSD == nil || *s.State.DailyUSD != 2 || s.State.TimeZone != "UTC" {
		t.Fatalf("caps' state: %+v", s.State)
	}
	s, err = summary(t, o, `{"by":"route","since":"2026-05-11T00:00:00Z"}`)
	if err != nil || s.Total.Requests != 2 || len(s.Groups) != 2 || got(s)["paid"] != 0.25 || got(s)["local"] != 0 {
		t.Fatalf("by route since the second day: %+v, %v", s, err)
	}
	s, err = summary(t, o, `{"by":"purpose","since":"2030-01-01T00:00:00Z"}`)
	if err != nil || s.Total.Requests != 0 || s.Groups == nil || len(s.Groups) != 0 {
		t.Fatalf("an empty period: %+v, %v", s, err)
	}
	for name, args := range map[string]string{
		"unknown grouping":  `{"by":"week"}`,
		"not a time":        `{"since":"yesterday"}`,
		"unknown field":     `{"by":"day","cap":5}`,
		"not an object":     `[1]`,
		"arguments too big": `{"by":"` + strings.Repeat("d", MaxOpArgs) + `"}`,
	} {
		var re *worker.RequestError
		if _, err := summary(t, o, args); !errors.As(err, &re) || re.Code != "invalid" {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	for _, op := range []string{"spend.set_cap", "spend.record", "spend."} {
		var re *worker.RequestError
		if _, err := o.HandleRequest(t.Context(), worker.Request{Op: op, Args: json.RawMessage(`{"name":"daily","usd":100}`)}); !errors.As(err, &re) || re.Code != "unsupported" {
			t.Errorf("%s: %v, want unsupported (spend is read-only)", op, err)
		}
	}
	if caps, err := st.SpendCaps(t.Context()); err != nil || len(caps) != 0 {
		t.Fatalf("caps after the cell's attempts: %v, %v", caps, err)
	}
}

// Whatever a cell sends as spend.summary's arguments is answered or
// refused with a RequestError; nothing panics.
func FuzzSummaryArgs(f *testing.F) {
	for _, seed := range []string{`{}`, `{"by":"route"}`, `{"by":"day","since":"2026-05-11T00:00:00+02:00"}`, `{"since":""}`, `{"by":1}`} {
		f.Add([]byte(seed))
	}
	st, _ := ledgerStore(f)
	o := NewOps(st, time.UTC, nil)
	f.Fuzz(func(t *testing.T, args []byte) {
		out, err := o.HandleRequest(context.Background(), worker.Request{Op: "spend.summary", Args: args})
		if err != nil {
			if _, ok := err.(*worker.RequestError); !ok {
				t.Fatalf("%q: %T %v, want a RequestError", args, err, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("answer %q is not JSON", out)
		}
	})
}
