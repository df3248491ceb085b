package worker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// BenchmarkSandbox measures what the worker sandbox costs, side by side with and without
// it (the daemon's sandbox: a denied data directory, read-only runtime, writable workspace
// and TMPDIR, and as root uid 0 without capabilities): a cell round trip ("x = 1"), a cell
// that opens and reads a file (the Landlock path check), and a cold start to the first
// cell (where the helper builds the ruleset).
//
//	go test -run '^$' -bench BenchmarkSandbox -benchtime 2000x ./internal/worker/
func BenchmarkSandbox(b *testing.B) {
	benchSetup(b)
	if _, err := kernel.LandlockABI(); err != nil {
		b.Skipf("landlock: %v", err)
	}
	data := filepath.Join(bench.dir, "data")
	os.MkdirAll(data, 0o700)
	os.WriteFile(filepath.Join(data, "operator-token"), []byte("x"), 0o600)
	for _, on := range []bool{false, true} {
		spec := func(b *testing.B) Spec {
			s := benchSpec(b)
			if on {
				s.Sandbox = kernel.Sandbox{Deny: []string{data}, ReadOnly: []string{bench.runtime},
					ReadWrite: []string{s.Workspace}, TempDir: b.TempDir(), DropCaps: os.Geteuid() == 0}
			}
			return s
		}
		start := func(b *testing.B) *Worker {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w, err := Start(ctx, spec(b))
			if err != nil {
				b.Fatalf("Start: %v", err)
			}
			b.Cleanup(w.Kill)
			return w
		}
		name := "sandbox=" + map[bool]string{false: "off", true: "on"}[on]
		for _, cell := range []struct{ op, code string }{
			{"roundtrip", "x = 1"},
			{"read-file", "open('/etc/hostname').read()"},
		} {
			b.Run(name+"/op="+cell.op, func(b *testing.B) {
				w := start(b)
				for i := range 20 {
					benchCell(b, w, "warm"+strconv.Itoa(i), cell.code)
				}
				samples := make([]float64, b.N)
				b.ResetTimer()
				for i := range b.N {
					t := time.Now()
					benchCell(b, w, "e"+strconv.Itoa(i), cell.code)
					samples[i] = float64(time.Since(t).Nanoseconds()) / 1e3
				}
				b.StopTimer()
				b.ReportMetric(median(samples), "p50-us")
				b.ReportMetric(percentile(samples, 0.99), "p99-us")
			})
		}
		b.Run(name+"/op=coldstart", func(b *testing.B) {
			n := min(b.N, coldstartCap)
			first := make([]float64, n)
			for i := range n {
				t := time.Now()
				w := start(b)
				benchCell(b, w, "c"+strconv.Itoa(i), "x = 1")
				first[i] = ms(time.Since(t))
				w.Kill()
			}
			b.ReportMetric(median(first), "first-cell-ms")
		})
	}
}
