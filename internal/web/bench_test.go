package web

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/live"
)

// BenchmarkBrowser measures, in one run, reconnect replay (connect → the
// last of 10,000 records received) and live fan-out to 20 clients while a
// 21st client stalls (records/s to all, and the slowest client's lag), and
// the same while a model step streams token deltas as fast as it can.
func BenchmarkBrowser(b *testing.B) {
	b.Run("op=replay-10000", func(b *testing.B) {
		h := start(b)
		for i := range 100 {
			h.admitN(b, 100, fmt.Sprintf("r%d", i), 100)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			c := h.hello(b, 0)
			got := 0
			for got < 10000 {
				m, err := tryRead(c, 10*time.Second)
				if err != nil {
					b.Fatalf("after %d records: %v", got, err)
				}
				got += len(m.Records)
			}
			lat = append(lat, time.Since(t0))
			c.CloseNow()
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	})
	for _, withStalled := range []bool{false, true} {
		b.Run(fmt.Sprintf("op=fanout-20/stalled=%v", withStalled), func(b *testing.B) { benchFanout(b, withStalled, false) })
	}
	b.Run("op=fanout-20/stalled=true/deltas=flood", func(b *testing.B) { benchFanout(b, true, true) })
}

// benchFanout streams 500 records, committed in 50 batches, to 20 clients,
// with or without a 21st client that never reads, and with or without a
// flood of token deltas (4 KiB pieces, published without pause) meanwhile.
func benchFanout(b *testing.B, withStalled, deltas bool) {
	{
		h := start(b)
		if withStalled {
			h.helloSmallBuffer(b, 0) // never reads
		}
		const clients, batches, per = 20, 50, 10
		conns := make([]*websocket.Conn, clients)
		for i := range conns {
			conns[i] = h.hello(b, 0)
			tryRead(conns[i], 5*time.Second) // the initial (empty) page
		}
		b.ResetTimer()
		var rate, maxLag, floodRate float64
		for n := range b.N {
			var wg sync.WaitGroup
			last := make([]time.Time, clients)
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got := 0
					for got < batches*per {
						m, err := tryRead(c, 20*time.Second)
						if err != nil {
							b.Errorf("client %d after %d records: %v", i, got, err)
							return
						}
						got += len(m.Records)
					}
					last[i] = time.Now()
				}()
			}
			stop := make(chan struct{})
			published := make(chan int, 1)
			if deltas {
				go func() {
					piece := strings.Repeat("t", 4<<10)
					k := 0
					for {
						select {
						case <-stop:
							published <- k
							return
						default:
						}
						h.deltas.Publish(live.Delta{Session: "default", Attempt: int64(n), Step: 1, Kind: "content", Text: piece})
						k++
						if k%64 == 0 {
							runtime.Gosched()
						}
					}
				}()
			}
			t0 := time.Now()
			for k := range batches {
				h.admitN(b, per, fmt.Sprintf("f%d-%d", n, k), 200)
			}
			committed := time.Now()
			wg.Wait()
			if deltas {
				close(stop)
				floodRate = float64(<-published) / time.Since(t0).Seconds()
			}
			slowest := committed
			for _, t := range last {
				if t.After(slowest) {
					slowest = t
				}
			}
			rate = float64(batches*per) / slowest.Sub(t0).Seconds()
			maxLag = max(maxLag, float64(slowest.Sub(committed).Microseconds())/1000)
		}
		b.ReportMetric(rate, "records/s")
		b.ReportMetric(maxLag, "slowest-lag-ms")
		if deltas {
			b.ReportMetric(floodRate, "deltas-published/s")
		}
	}
}
