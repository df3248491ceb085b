package history

import (
	"context"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// BenchmarkCompact is the host's time per compaction of a 40-entry run
// (reading the originals, rendering the source, validating, committing),
// with an instant summarizer whose time is excluded.
func BenchmarkCompact(b *testing.B) {
	var inModel time.Duration
	model := modelFunc(func(ctx context.Context, req provider.Request) (*provider.Response, error) {
		t0 := time.Now()
		defer func() { inModel += time.Since(t0) }()
		return &provider.Response{Content: "a short summary of the notes"}, nil
	})
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st, ac := newStore(b, 50)
		c := New(Config{Store: st, Model: model})
		p := Plan{Session: "p", Epoch: ac.Epoch, Version: ac.Version}
		for _, e := range ac.Entries[:40] {
			p.Units = append(p.Units, Unit{Refs: []store.EntryRef{e.Ref()}, Tokens: 80})
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := c.Compact(context.Background(), p); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
	}
	b.ReportMetric(float64((total-inModel).Microseconds())/float64(b.N)/1000, "host_ms/compaction")
}
