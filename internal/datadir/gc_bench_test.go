package datadir

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

// gcLab is a data directory whose store runs on a clock the benchmark
// moves: history is written in the past, gc runs now.
type gcLab struct {
	dir     string
	st      *store.Store
	now     atomic.Int64 // unix ms
	attempt int64
	steps   int
}

func newGCLab(b *testing.B) *gcLab {
	b.Helper()
	l := &gcLab{dir: filepath.Join(b.TempDir(), "data")}
	if _, err := setupInit(l.dir); err != nil {
		b.Fatal(err)
	}
	l.now.Store(time.Now().Add(-10 * 24 * time.Hour).UnixMilli())
	st, err := store.Open(context.Background(), l.dir, store.Options{Clock: func() time.Time { return time.UnixMilli(l.now.Load()) }})
	if err != nil {
		b.Fatal(err)
	}
	l.st = st
	b.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) (err error) {
		if _, err := tx.EnsureSession("default"); err != nil {
			return err
		}
		l.attempt, _, err = tx.StartAttempt(store.NewAttempt{Session: "default", WakeReason: "bench"})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return l
}

// step records one model step of text, as the turn loop does.
func (l *gcLab) step(tx *store.Tx, text string) error {
	l.steps++
	_, err := tx.RecordStep(store.StepResult{Session: "default", Attempt: l.attempt, Ordinal: l.steps, Route: "main",
		State: "completed", Text: text, NotSent: true, Started: tx.Now()})
	return err
}

// history writes n steps of size bytes each in the past and covers them
// with normal summaries of 100 entries each: originals retention may
// collect.
func (l *gcLab) history(b *testing.B, n, size int) {
	b.Helper()
	ctx := context.Background()
	text := strings.Repeat("a step's scratchpad text. ", size/26+1)[:size]
	for i := 0; i < n; i += 250 {
		if err := l.st.Write(ctx, func(tx *store.Tx) error {
			for range min(250, n-i) {
				if err := l.step(tx, text); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	sess, err := l.st.Session(ctx, "default")
	if err != nil {
		b.Fatal(err)
	}
	for {
		ac, err := l.st.Active(ctx, "default", sess.ContextEpoch, 0)
		if err != nil {
			b.Fatal(err)
		}
		var refs []store.EntryRef
		for _, e := range ac.Entries {
			if e.Item != nil {
				refs = append(refs, e.Ref())
				if len(refs) == 100 {
					break
				}
			} else if len(refs) > 0 {
				break
			}
		}
		if len(refs) < 100 {
			return
		}
		if err := l.st.Write(ctx, func(tx *store.Tx) error {
			_, err := tx.CommitSummary(store.NewSummary{Session: "default", Epoch: ac.Epoch, Version: ac.Version, Covers: refs,
				Kind: store.SummaryNormal, Text: "a hundred steps of scratchpad", SourceTokens: 100 * size / 4, SummaryTokens: 10})
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// artifacts writes n artifacts of size bytes each, recorded and old.
func (l *gcLab) artifacts(b *testing.B, n, size int) {
	b.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(l.dir, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	dir := filepath.Join(l.dir, "artifacts", "sha256")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, size)
	old := time.Now().Add(-10 * 24 * time.Hour)
	for i := range n {
		copy(body, fmt.Sprintf("artifact %d ", i))
		sum := sha256.Sum256(body)
		sha := hex.EncodeToString(sum[:])
		p := filepath.Join(dir, sha)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			b.Fatal(err)
		}
		os.Chtimes(p, old, old)
		if _, err := db.Exec(`INSERT INTO artifacts (sha256, size, media_type, created_at) VALUES (?, ?, 'text/plain', ?)`, sha, size, old.UnixMilli()); err != nil {
			b.Fatal(err)
		}
	}
}

// commits records steps one transaction each, back to back, as the turn
// loop does, until stop closes, and returns each commit's latency.
func (l *gcLab) commits(b *testing.B, stop <-chan struct{}) []time.Duration {
	text := strings.Repeat("x", 2048)
	var lat []time.Duration
	for {
		select {
		case <-stop:
			return lat
		default:
		}
		t := time.Now()
		if err := l.st.Write(context.Background(), func(tx *store.Tx) error { return l.step(tx, text) }); err != nil {
			b.Error(err)
			return lat
		}
		lat = append(lat, time.Since(t))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchEnvInt reads a size from the environment, else def.
func benchEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkStepCommitDuringGC: a writer records model steps back to back
// (one transaction each, as the turn loop commits a step) while online gc
// collects, side by side with the same writer for as long without gc.
// history: 8,000 originals of 4 KiB under summaries, past [retention]
// history_days (KLBR_BENCH_GC_RECORDS sets the count). artifacts: 256
// artifacts of 1 MiB past artifact_days (KLBR_BENCH_GC_ARTIFACTS sets the
// count: 1024 is 1 GiB). Reports the step commit's p50, p99 and longest
// latency with and without gc, their ratios, and what gc freed.
func BenchmarkStepCommitDuringGC(b *testing.B) {
	for _, kind := range []string{"history", "artifacts"} {
		b.Run(kind, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				l := newGCLab(b)
				r := config.Retention{}
				switch kind {
				case "history":
					l.history(b, benchEnvInt("KLBR_BENCH_GC_RECORDS", 8000), 4096)
					r.HistoryDays = 1
				default:
					l.artifacts(b, benchEnvInt("KLBR_BENCH_GC_ARTIFACTS", 256), 1<<20)
					r.ArtifactDays = 1
				}
				l.now.Store(time.Now().UnixMilli())
				arts, err := artifacts.New(filepath.Join(l.dir, "artifacts"))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				stop := make(chan struct{})
				done := make(chan []time.Duration)
				go func() { done <- l.commits(b, stop) }()
				t0 := time.Now()
				res, err := Collect(context.Background(), l.st, r, time.Now(), GCOptions{Artifacts: arts})
				took := time.Since(t0)
				close(stop)
				during := <-done
				if err != nil {
					b.Fatal(err)
				}
				if res.History.Records == 0 && len(res.Removed) == 0 {
					b.Fatal("gc collected nothing")
				}
				// The baseline: the same writer, as long, without gc.
				stop2 := make(chan struct{})
				go func() { done <- l.commits(b, stop2) }()
				time.Sleep(took)
				close(stop2)
				base := <-done
				b.StopTimer()
				p50, p99, top := quantile(during, .5), quantile(during, .99), quantile(during, 1)
				b50, b99, btop := quantile(base, .5), quantile(base, .99), quantile(base, 1)
				b.ReportMetric(ms(took), "gc-ms")
				b.ReportMetric(float64(res.History.Bytes+res.Bytes)/(1<<20), "freed-MiB")
				b.ReportMetric(ms(p50), "p50-gc-ms")
				b.ReportMetric(ms(p99), "p99-gc-ms")
				b.ReportMetric(ms(top), "max-gc-ms")
				b.ReportMetric(ms(b50), "p50-base-ms")
				b.ReportMetric(ms(b99), "p99-base-ms")
				b.ReportMetric(ms(btop), "max-base-ms")
				b.ReportMetric(float64(p50)/float64(b50), "p50-ratio")
				b.ReportMetric(float64(p99)/float64(b99), "p99-ratio")
				b.ReportMetric(float64(len(during)), "commits-during-gc")
				b.ReportMetric(float64(len(base)), "commits-base")
				b.StartTimer()
			}
		})
	}
}
