package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// grow appends n records to session's context in batches, compacting all
// but the last keep entries into summaries as it goes (as the turn loop
// would), so that the active context stays small however long the history.
func grow(b *testing.B, s *Store, session string, n, keep int) {
	ctx := context.Background()
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"}
	const batch = 2000
	for done := 0; done < n; done += batch {
		if err := s.Write(ctx, func(tx *Tx) error {
			for i := done; i < min(done+batch, n); i++ {
				text := fmt.Sprintf("record %d mentions %s and %s; unique%d", i, words[i%10], words[(i/10)%10], i)
				ev, _, err := tx.appendItem(session, "test.input", LaneInput, fmt.Sprintf(`{"text":%q}`, text), tx.now, tx.now)
				if err != nil {
					return err
				}
				if err := tx.addContext(session, "input", ev, ""); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		ac, err := s.Active(ctx, session, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(ac.Entries) > 2*keep {
			var refs []EntryRef
			for _, e := range ac.Entries[:len(ac.Entries)-keep] {
				refs = append(refs, e.Ref())
			}
			if err := s.Write(ctx, func(tx *Tx) error {
				_, err := tx.CommitSummary(NewSummary{Session: session, Epoch: 0, Version: ac.Version, Covers: refs, Kind: SummaryNormal,
					Text: fmt.Sprintf("summary through record %d", done), SourceTokens: 1000, SummaryTokens: 10})
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func dbBytes(dir string) (db, wal int64) {
	if fi, err := os.Stat(filepath.Join(dir, FileName)); err == nil {
		db = fi.Size()
	}
	if fi, err := os.Stat(filepath.Join(dir, FileName+"-wal")); err == nil {
		wal = fi.Size()
	}
	return db, wal
}

// BenchmarkHistory measures, at 1 k, 10 k, 100 k and 1 M history items:
// reading the active context (what each step's assembly reads), and
// history.search's p50 and p99 over a mix of rare and common words; plus
// database bytes per 1 k items. HISTORY_BENCH_MAX caps the sizes (default
// 1M).
func BenchmarkHistory(b *testing.B) {
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	if v := os.Getenv("HISTORY_BENCH_MAX"); v != "" {
		var max int
		fmt.Sscan(v, &max)
		sizes = slices.DeleteFunc(sizes, func(n int) bool { return n > max })
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			s, err := Open(context.Background(), dir, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.Write(context.Background(), func(tx *Tx) error { _, err := tx.EnsureSession("p"); return err }); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			grow(b, s, "p", n, 100)
			growth := time.Since(start)
			ctx := context.Background()
			queries := []string{"unique7", "alpha bravo", "charlie", fmt.Sprintf("unique%d", n/2), "echo golf", "nothing-matches"}
			var lat []time.Duration
			// A step's history work: one record committed to the context,
			// then the incremental read of what the transcript lacks.
			ac, err := s.Active(ctx, "p", 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			last := ac.Entries[len(ac.Entries)-1].Position
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				addItemB(b, s, "p", fmt.Sprintf("step %d", i))
				ac, err := s.Active(ctx, "p", 0, last)
				if err != nil || len(ac.Entries) != 1 {
					b.Fatal(err, len(ac.Entries))
				}
				last = ac.Entries[0].Position
			}
			b.StopTimer()
			step := float64(b.Elapsed().Microseconds()) / float64(b.N)
			t0 := time.Now()
			for range 50 {
				if _, err := s.Active(ctx, "p", 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			assembly := float64(time.Since(t0).Microseconds()) / 50
			for range 20 {
				for _, q := range queries {
					t0 := time.Now()
					if _, err := s.Search(ctx, q, SearchScope{Session: "p"}, 20); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
			}
			slices.Sort(lat)
			db, wal := dbBytes(dir)
			// The index's bytes: FTS5's segments and its copy of the text.
			var idx, text int64
			_ = s.rdb.QueryRow(`SELECT COALESCE(sum(length(block)), 0) FROM history_fts_data`).Scan(&idx)
			_ = s.rdb.QueryRow(`SELECT COALESCE(sum(length(c0) + length(c1)), 0) FROM history_fts_content`).Scan(&text)
			b.ReportMetric(step, "step_us")
			b.ReportMetric(assembly, "full_rebuild_us")
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap_MiB")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "search_p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "search_p99_ms")
			b.ReportMetric(float64(db)/float64(n)*1000, "db_B/1k_items")
			b.ReportMetric(float64(wal), "wal_B")
			if db > 0 {
				b.ReportMetric(float64(idx+text)/float64(db), "index_fraction")
			}
			b.ReportMetric(float64(n)/growth.Seconds(), "items_written/s")
		})
	}
}

func addItemB(b *testing.B, s *Store, session, text string) {
	if err := s.Write(context.Background(), func(tx *Tx) error {
		ev, _, err := tx.appendItem(session, "test.input", LaneInput, fmt.Sprintf(`{"text":%q}`, text), tx.now, tx.now)
		if err != nil {
			return err
		}
		return tx.addContext(session, "input", ev, "")
	}); err != nil {
		b.Fatal(err)
	}
}
