package datadir

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// fill admits n inputs in batches.
func fill(b *testing.B, st *store.Store, prefix string, n int) {
	b.Helper()
	now := time.Now()
	for i := 0; i < n; i += 500 {
		err := st.Write(context.Background(), func(tx *store.Tx) error {
			for j := i; j < min(i+500, n); j++ {
				if _, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator", SourceKey: fmt.Sprintf("%s%d", prefix, j),
					Conversation: "operator", Author: "operator", OccurredAt: now, ReceivedAt: now,
					Body: "a message of ordinary length, as someone would send it to their agent"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// burst admits from clients parallel senders until stop closes, and
// returns every admission's latency.
func burst(st *store.Store, clients int, stop <-chan struct{}) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	var next atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			for {
				select {
				case <-stop:
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					return
				default:
				}
				i := next.Add(1)
				t := time.Now()
				if _, err := admit(st, fmt.Sprintf("burst%d", i)); err != nil {
					panic(err)
				}
				mine = append(mine, time.Since(t))
			}
		})
	}
	wg.Wait()
	return lat
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*q))]
}

// BenchmarkBackupDuringBurst: a backup of a database of 200,000 inputs
// while 16 clients send; side by side, the same burst for the same time
// without a backup. Reports backup MB/s, its longest step, and the p99 and
// longest admission latency with and without the backup.
func BenchmarkBackupDuringBurst(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "data")
	if _, err := setupInit(dir); err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	fill(b, st, "seed", 200_000)
	b.ResetTimer()
	for i := range b.N {
		stop := make(chan struct{})
		var lat []time.Duration
		done := make(chan struct{})
		go func() { lat = burst(st, 16, stop); close(done) }()
		res, err := Backup(context.Background(), BackupOptions{DataDir: dir}, filepath.Join(b.TempDir(), fmt.Sprint("b", i)))
		close(stop)
		<-done
		if err != nil {
			b.Fatal(err)
		}
		// The baseline: the same burst, as long, without a backup.
		stop2 := make(chan struct{})
		done2 := make(chan struct{})
		var base []time.Duration
		go func() { base = burst(st, 16, stop2); close(done2) }()
		time.Sleep(res.Database.Duration)
		close(stop2)
		<-done2
		mb := float64(res.Database.Bytes) / (1 << 20)
		b.ReportMetric(mb/res.Database.Duration.Seconds(), "db-MB/s")
		b.ReportMetric(mb, "db-MB")
		b.ReportMetric(float64(res.Database.LongestStep.Microseconds())/1000, "longest-step-ms")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds())/1000, "p99-admit-ms")
		b.ReportMetric(float64(quantile(lat, 1).Microseconds())/1000, "max-admit-ms")
		b.ReportMetric(float64(quantile(base, 0.99).Microseconds())/1000, "p99-admit-no-backup-ms")
		b.ReportMetric(float64(quantile(base, 1).Microseconds())/1000, "max-admit-no-backup-ms")
		b.ReportMetric(float64(len(lat)), "admits-during-backup")
	}
}

// BenchmarkCheck100k: klbr-core check of a data directory holding 100,000
// inputs (each an event, an input and an inbox row).
func BenchmarkCheck100k(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "data")
	if _, err := setupInit(dir); err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	fill(b, st, "k", 100_000)
	st.Close()
	b.ResetTimer()
	for range b.N {
		res, err := Check(context.Background(), dir)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Clean() {
			b.Fatal(res.Findings)
		}
		b.ReportMetric(float64(res.Records), "records")
	}
}
