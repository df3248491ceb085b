package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

func benchStore(b *testing.B) *store.Store {
	b.Helper()
	st, err := store.Open(context.Background(), b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		b.Fatal(err)
	}
	return st
}

func scheduleFar(b *testing.B, m *Manager, n int) {
	b.Helper()
	far := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				_, err := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.x:y",
					Schedule: Schedule{At: far.Add(time.Duration(i) * time.Millisecond).UnixMilli()}})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// Job admission (jobs.schedule through validation and one store write)
// side by side with the baseline: an operator input's admission (one store write).
func BenchmarkAdmission(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("job/clients=%d", par), func(b *testing.B) {
			st := benchStore(b)
			m := New(Config{Store: st, Tree: func(string) string { return "/nonexistent" }})
			due := time.Now().Add(time.Hour).UnixMilli()
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release,
						Entry: "klbr_skills.x:y", Input: json.RawMessage(`{"n":1}`), Schedule: Schedule{At: due}}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
		b.Run(fmt.Sprintf("input/clients=%d", par), func(b *testing.B) {
			st := benchStore(b)
			var seq sync.Mutex
			n := 0
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					seq.Lock()
					n++
					key := fmt.Sprintf("k%d", n)
					seq.Unlock()
					if err := st.Write(context.Background(), func(tx *store.Tx) error {
						_, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator", SourceKey: key, Conversation: "operator",
							Author: "operator", OccurredAt: tx.Now(), ReceivedAt: tx.Now(), Body: "hello"})
						return err
					}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "inputs/s")
		})
	}
}

// Timer lateness: with 10,000 jobs scheduled an hour ahead, 200 probe jobs
// fall due 10 ms apart; lateness is when each run started minus its
// deadline. The runs themselves are trivial (execHook), so this measures
// the scheduler, not Python.
func BenchmarkTimerLateness(b *testing.B) {
	for range b.N {
		st := benchStore(b)
		m := New(Config{Store: st, Tree: func(string) string { return "/nonexistent" }, MaxConcurrent: 4})
		scheduleFar(b, m, 10000)
		var mu sync.Mutex
		var late []time.Duration
		m.execHook = func(_ context.Context, j store.Job, due time.Time) *store.JobEnd {
			d := time.Since(due)
			mu.Lock()
			late = append(late, d)
			mu.Unlock()
			return &store.JobEnd{ID: j.ID, To: store.JobSucceeded, Result: json.RawMessage(`null`)}
		}
		// The probes are admitted first, due from 2 s on, so that no
		// admission competes with their runs.
		start := time.Now().Add(2 * time.Second)
		const probes = 200
		for i := range probes {
			at := start.Add(time.Duration(i) * 10 * time.Millisecond)
			if _, err := m.Schedule(context.Background(), ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.x:y",
				Schedule: Schedule{At: at.UnixMilli()}}); err != nil {
				b.Fatal(err)
			}
		}
		if time.Now().After(start) {
			b.Fatal("admitting the probes took longer than 2 s")
		}
		if err := m.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(late)
			mu.Unlock()
			if n >= probes || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		m.Close()
		mu.Lock()
		slices.Sort(late)
		if len(late) < probes {
			b.Fatalf("%d of %d probes ran", len(late), probes)
		}
		b.ReportMetric(float64(late[len(late)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(late[len(late)*99/100].Microseconds())/1000, "p99-ms")
		mu.Unlock()
	}
}

// Idle wake-ups: with 10,000 jobs scheduled an hour ahead, the scheduler
// sleeps on one timer; over 5 s idle it should wake 0 times, and the
// process should use next to no CPU.
func BenchmarkIdleWakeups(b *testing.B) {
	for range b.N {
		st := benchStore(b)
		m := New(Config{Store: st, Tree: func(string) string { return "/nonexistent" }})
		scheduleFar(b, m, 10000)
		if err := m.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // settle: the kicks of the admissions
		w0 := m.Wakeups()
		cpu0 := cpuTime()
		const idle = 5 * time.Second
		time.Sleep(idle)
		wakeups := m.Wakeups() - w0
		cpu := cpuTime() - cpu0
		m.Close()
		b.ReportMetric(float64(wakeups)/idle.Seconds(), "wakeups/s")
		b.ReportMetric(float64(cpu.Microseconds())/1000/idle.Seconds(), "cpu-ms/s")
		if next := time.Until(m.NextWakeup()); m.NextWakeup().IsZero() || next < 50*time.Minute {
			b.Fatalf("the timer is armed for %v, want the deadline an hour ahead", next)
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
