package ingress

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// BenchmarkIngressBurst admits a burst of 5,000 gateway messages through
// ingress.sock twice in the same run: as klbr-discord sends them (ordered
// batches of what gathered, up to 256 per request, one transaction each) and
// one request and one transaction per input. While the batched burst runs, a
// DM goes in through its own request every 500 messages; its time to
// admitted (committed) is reported.
func BenchmarkIngressBurst(b *testing.B) {
	const burst = 5000
	c := startCore(b, b.TempDir())
	ctx := context.Background()
	next := 100000000
	mk := func(mode string) ingressapi.Message {
		next++
		if mode == ingressapi.ModeDM {
			return msg(fmt.Sprint(next), "20", mode, "a DM")
		}
		return msg(fmt.Sprint(next), fmt.Sprint(10+next%3), mode, "ambient chatter")
	}
	var batchedTotal, singleTotal time.Duration
	var dmLat []time.Duration
	for b.Loop() {
		msgs := make([]ingressapi.Message, burst)
		for i := range msgs {
			msgs[i] = mk(ingressapi.ModeAmbient)
		}
		dms := make(chan time.Duration, burst)
		start := time.Now()
		for i := 0; i < burst; i += ingressapi.MaxBatch {
			if i > 0 && i%512 == 0 {
				dm := mk(ingressapi.ModeDM)
				go func() {
					t0 := time.Now()
					if _, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: []ingressapi.Message{dm}}); err != nil {
						b.Error(err)
					}
					dms <- time.Since(t0)
				}()
			}
			resp, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: msgs[i:min(i+ingressapi.MaxBatch, burst)]})
			if err != nil || resp.Results[0].Error != nil {
				b.Fatal(err)
			}
		}
		batchedTotal += time.Since(start)
		for range burst / 512 {
			dmLat = append(dmLat, <-dms)
		}
		for i := range msgs {
			msgs[i] = mk(ingressapi.ModeAmbient)
		}
		start = time.Now()
		for _, m := range msgs {
			if _, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: []ingressapi.Message{m}}); err != nil {
				b.Fatal(err)
			}
		}
		singleTotal += time.Since(start)
	}
	n := float64(b.N * burst)
	batched, single := n/batchedTotal.Seconds(), n/singleTotal.Seconds()
	sort.Slice(dmLat, func(i, j int) bool { return dmLat[i] < dmLat[j] })
	b.ReportMetric(batched, "batched_msgs/s")
	b.ReportMetric(single, "single_msgs/s")
	b.ReportMetric(batched/single, "ratio")
	b.ReportMetric(float64(dmLat[len(dmLat)/2].Microseconds())/1000, "dm_p50_ms")
	b.ReportMetric(float64(dmLat[len(dmLat)-1].Microseconds())/1000, "dm_max_ms")
	b.ReportMetric(0, "ns/op")
}
