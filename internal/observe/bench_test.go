package observe

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

const benchObserver = `
def tally(inp):
    return {"state": {"n": inp["state"].get("n", 0) + 1}}
SLOTS["bench.tally"] = tally
`

const benchSettings = "[[hooks.observers]]\nhandler = \"bench.tally\"\nevents = [\"input.accepted\"]\nstate_version = 1\n"

// BenchmarkObserverLatency is the time from an input's commit to its
// observer's acknowledged answer, p50 and p99 over 200 inputs admitted 5 ms
// apart to a running observer (event times are kept in milliseconds).
func BenchmarkObserverLatency(b *testing.B) {
	f := newFixture(b)
	f.release(benchObserver, benchSettings)
	var mu sync.Mutex
	var lat []time.Duration
	r := New(Config{Store: f.st, Hooks: f.hk, Observe: func(_, outcome string, d time.Duration) {
		if outcome == "ok" {
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		}
	}})
	if _, err := r.Pass(context.Background(), "s"); err != nil { // bound before the first input
		b.Fatal(err)
	}
	r.Start("s")
	defer r.Close()
	const n = 200
	for b.Loop() {
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		for range n {
			f.admit("x")
			time.Sleep(5 * time.Millisecond)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			mu.Lock()
			got := len(lat)
			mu.Unlock()
			if got >= n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d delivered", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}

// BenchmarkObserverBacklog delivers 10,000 backlogged inputs to one
// observer (each answer a state update: one hook round trip and one commit
// per delivery) and reports deliveries per second.
func BenchmarkObserverBacklog(b *testing.B) {
	const n = 10000
	var rate float64
	for b.Loop() {
		b.StopTimer()
		f := newFixture(b)
		f.release(benchObserver, benchSettings)
		r := New(Config{Store: f.st, Hooks: f.hk})
		if _, err := r.Pass(context.Background(), "s"); err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		for done := 0; done < n; done += 1000 {
			if err := f.st.Write(context.Background(), func(tx *store.Tx) error {
				for i := done; i < done+1000; i++ {
					if _, err := tx.AdmitInput(store.NewInput{Session: "s", SourceKind: "operator", SourceKey: fmt.Sprintf("b%d", i),
						Conversation: "operator", Author: "operator", Directed: true, OccurredAt: now, ReceivedAt: now, Body: "x"}); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		if _, err := r.Pass(context.Background(), "s"); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		b.StopTimer()
		st, _, _ := f.st.HookState(context.Background(), "s", "bench.tally")
		if string(st) != fmt.Sprintf(`{"n":%d}`, n) {
			b.Fatalf("state %s after the backlog", st)
		}
		rate = n / took.Seconds()
		f.close()
		b.StartTimer()
	}
	b.ReportMetric(rate, "deliveries/s")
}
