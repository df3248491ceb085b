package spend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	_ "time/tzdata"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/provider"
)

// model answers every request with the usage it is given.
type model struct {
	usage    func() provider.Usage
	requests atomic.Int64
	block    chan struct{} // when set, each request waits on it
}

func (m *model) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	m.requests.Add(1)
	if m.block != nil {
		select {
		case <-m.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &provider.Response{Content: "ok", Usage: m.usage()}, nil
}

func ip(i int) *int         { return &i }
func fp(f float64) *float64 { return &f }
func usage(p, c int) provider.Usage {
	return provider.Usage{PromptTokens: ip(p), CompletionTokens: ip(c)}
}

// A dollar per million input and output tokens: a request of 100k+100k is $0.20.
var dollar = Prices{"paid": {Input: 1, Output: 1, CacheRead: 1, CacheWrite: 1}}

func newMeter(t *testing.T, s config.Spend, used float64, tokens int64) *Meter {
	t.Helper()
	m, err := New(t.Context(), Options{Spend: s, Prices: dollar, DefaultOut: 100_000,
		Used: func(context.Context, time.Time) (float64, int64, error) { return used, tokens, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ask(ctx context.Context, c provider.Completer, session string) error {
	_, err := c.Complete(ctx, provider.Request{Messages: []provider.Message{{Role: "user", Content: "hi"}}, MaxTokens: 100_000,
		Meta: provider.RequestMeta{Session: session}})
	return err
}

// A daily cap reached mid-session stops the next request; the session
// shows the hold; the day's end in the cap's time zone resumes it by itself.
func TestDailyCapHoldsUntilMidnightInItsTimeZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// synctest's clock starts at 2000-01-01 00:00 UTC: 09:00 in Tokyo,
		// whose midnight is 15:00 UTC.
		m := newMeter(t, config.Spend{DailyUSD: fp(0.5), TimeZone: "Asia/Tokyo"}, 0, 0)
		mod := &model{usage: func() provider.Usage { return usage(100_000, 100_000) }}
		c := m.Wrap("paid", mod)
		for i := range 3 { // $0.20 each: after three, $0.60 is past the cap
			if err := ask(t.Context(), c, "s"); err != nil {
				t.Fatal(i, err)
			}
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- ask(t.Context(), c, "s") }()
		synctest.Wait()
		h, ok := m.Holds()["s"]
		if !ok || h.Cap != CapDailyUSD || mod.requests.Load() != 3 {
			t.Fatalf("holds %v, %d requests: the fourth should wait at the daily cap", m.Holds(), mod.requests.Load())
		}
		tokyo, _ := time.LoadLocation("Asia/Tokyo")
		if want := time.Date(2000, 1, 2, 0, 0, 0, 0, tokyo); !h.Resets.Equal(want) {
			t.Fatalf("resets %v, want %v", h.Resets, want)
		}
		if s := h.String(); s != "spend cap: daily_usd, resets 2000-01-02 00:00 JST" {
			t.Fatalf("state %q", s)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 15*time.Hour {
			t.Fatalf("resumed after %v, want 15h (Tokyo's midnight)", waited)
		}
		if len(m.Holds()) != 0 || mod.requests.Load() != 4 {
			t.Fatalf("after midnight: holds %v, %d requests", m.Holds(), mod.requests.Load())
		}
	})
}

// Raising the cap resumes a held request at once.
func TestRaisingTheCapResumesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMeter(t, config.Spend{DailyUSD: fp(1), TimeZone: "UTC"}, 1.5, 0) // a restart: the ledger already holds $1.50 today
		c := m.Wrap("paid", &model{usage: func() provider.Usage { return usage(10, 10) }})
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- ask(t.Context(), c, "s") }()
		synctest.Wait()
		if _, ok := m.Holds()["s"]; !ok {
			t.Fatal("a restart reset the cap: the request was not held")
		}
		if err := m.SetCap("daily", 5); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil || time.Since(start) != 0 {
			t.Fatalf("after raising the cap: %v after %v", err, time.Since(start))
		}
	})
}

// A route without a price is counted in tokens, and the token cap holds it.
func TestTokenCapHoldsAnUnpricedRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMeter(t, config.Spend{DailyUSD: fp(0.01), DailyTokens: 1000, TimeZone: "UTC"}, 0, 0)
		mod := &model{usage: func() provider.Usage { return usage(400, 200) }}
		c := m.Wrap("local", mod)
		resp, err := c.Complete(t.Context(), provider.Request{MaxTokens: 10})
		if err != nil || resp.CostUSD != nil || resp.CostSource != "none" {
			t.Fatalf("unpriced: %v, %+v", err, resp)
		}
		if err := ask(t.Context(), c, "s"); err != nil { // 600 + this request's bound: still under at its start
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		err = ask(ctx, c, "s")
		if !errors.Is(err, context.DeadlineExceeded) || mod.requests.Load() != 2 {
			t.Fatalf("past daily_tokens: %v, %d requests", err, mod.requests.Load())
		}
		if st := m.State(); st.DayTokens != 1200 || st.DayUSD != 0 {
			t.Fatalf("state %+v", st)
		}
	})
}

// A provider's reported cost beats the price.
func TestReportedCostBeatsPrice(t *testing.T) {
	u := usage(1_000_000, 0)
	u.CostUSD = fp(0.003)
	if c, src := dollar.Cost("paid", u); *c != 0.003 || src != "reported" {
		t.Fatalf("cost %v %s", *c, src)
	}
	u.CostUSD = nil
	u.CacheReadTokens = ip(800_000)
	p := Prices{"paid": {Input: 1, Output: 2, CacheRead: 0.1, CacheWrite: 1}}
	if c, src := p.Cost("paid", u); src != "price" || *c < 0.28-1e-12 || *c > 0.28+1e-12 {
		t.Fatalf("cost %v %s; want $0.28 (200k at $1, 800k cached at $0.10)", *c, src)
	}
}

// Requests started at once overshoot a cap by no more than those in
// flight: each is reserved at its largest cost before it starts.
func TestConcurrentRequestsOvershootByNoMoreThanInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMeter(t, config.Spend{DailyUSD: fp(0.1), TimeZone: "UTC"}, 0, 0)
		block := make(chan struct{})
		mod := &model{usage: func() provider.Usage { return usage(10_000, 20_000) }, block: block} // $0.03 each
		c := m.Wrap("paid", mod)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				c.Complete(ctx, provider.Request{MaxTokens: 20_000, Messages: []provider.Message{{Content: "x"}}})
			})
		}
		synctest.Wait()
		started := mod.requests.Load()
		// Each reserves ~$0.02: five fit under $0.10 before any settles.
		if started == 0 || started > 5 {
			t.Fatalf("%d of 10 started at once", started)
		}
		close(block)
		synctest.Wait()
		cancel()
		wg.Wait()
		spent := m.State().DayUSD
		if spent > 0.1+float64(started)*0.03+1e-9 {
			t.Fatalf("spent $%.3f with %d in flight at once", spent, started)
		}
		if mod.requests.Load() == 10 {
			t.Fatalf("all ten ran: spent $%.3f against a $0.10 cap", spent)
		}
	})
}

// Past warn_at, one warning per cap and period.
func TestWarnOncePastWarnAt(t *testing.T) {
	var warned []string
	m, err := New(t.Context(), Options{Spend: config.Spend{DailyUSD: fp(1), TimeZone: "UTC"}, Prices: dollar,
		Warn: func(c string, used, limit float64) { warned = append(warned, c) }})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Wrap("paid", &model{usage: func() provider.Usage { return usage(300_000, 0) }})
	for range 3 {
		if err := ask(t.Context(), c, "s"); err != nil {
			t.Fatal(err)
		}
	}
	if len(warned) != 1 || warned[0] != CapDailyUSD {
		t.Fatalf("warned %v", warned)
	}
}
