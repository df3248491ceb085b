package discord

import (
	"fmt"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
)

// BenchmarkOneAuthorFlood: one author posts 500 messages at once into a
// guild channel, then another author sends a DM; the fake Discord, the
// transport and a real klbr-core (store, admission, ingress.sock) run as in
// production. Reported per round: the DM's time from dispatch to admitted
// (dm-ms), the flood's messages admitted, and the admission throughput
// (flood-msgs/s: the 500 messages dispatched, over the time until the
// last one admitted is in). Sub-benchmarks: limited (the shipped per-author
// limit: 20 at once, 30 a minute) and unlimited (the baseline: every message
// admitted, in order).
func BenchmarkOneAuthorFlood(b *testing.B) {
	for _, mode := range []struct {
		name string
		lim  FloodLimits
	}{{"unlimited", FloodLimits{Off: true}}, {"limited", FloodLimits{}}} {
		b.Run(mode.name, func(b *testing.B) {
			c := startCore(b, b.TempDir())
			fake := discordtest.New("99")
			defer fake.Close()
			runTransportWith(b, fake, c.socket, func(cfg *Config) { cfg.Probe.Interval = -1; cfg.Flood = mode.lim })
			next := 30000000
			var dmTotal time.Duration
			var admittedTotal, rounds int
			var floodTime time.Duration
			for b.Loop() {
				before := len(pending(b, c))
				start := time.Now()
				for range 500 {
					next++
					fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(next), "50", "7", "5", "spam spam spam"))
				}
				next++
				dmAt := time.Now()
				fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(next), "60", "", "6", "a question"))
				dmKey := "discord:60"
				var dmLat time.Duration
				for dmLat == 0 {
					ps := pending(b, c)
					if count(ps[before:], dmKey) == 1 {
						dmLat = time.Since(dmAt)
					}
				}
				// The flood's admissions settle (nothing more arrives for 50 ms).
				last, lastAt := -1, time.Now()
				for time.Since(lastAt) < 50*time.Millisecond {
					if n := len(pending(b, c)); n != last {
						last, lastAt = n, time.Now()
					}
					time.Sleep(2 * time.Millisecond)
				}
				dmTotal += dmLat
				admittedTotal += last - before - 1
				floodTime += lastAt.Sub(start)
				rounds++
			}
			b.ReportMetric(float64(dmTotal.Microseconds())/1000/float64(rounds), "dm-ms")
			b.ReportMetric(float64(admittedTotal)/float64(rounds), "flood-admitted")
			b.ReportMetric(float64(500*rounds)/floodTime.Seconds(), "flood-msgs/s")
		})
	}
}
