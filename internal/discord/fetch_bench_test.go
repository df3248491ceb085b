package discord

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// fetchBenchLimits lets a 60 MB attachment through and never runs out of
// the hourly budget: the benchmarks measure the fetch, not its refusal.
// rate paces each fetch (negative: unpaced, as before the pace was built).
func fetchBenchLimits(rate int64) func(cfg *Config) {
	return func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{Off: true}
		cfg.Fetch = FetchLimits{MaxBytes: 64 << 20, Timeout: 5 * time.Minute, BytesPerHour: 1 << 50, BytesPerSecond: rate}
	}
}

func startFetchBenchCore(b *testing.B) *core {
	return startCoreWith(b, b.TempDir(), func(ic *ingress.Config) { ic.AttachmentMaxBytes = 64 << 20 })
}

// settledFetch waits for the attachment's fetch to end and fails the
// benchmark unless it ended fetched.
func settledFetch(b *testing.B, c *core, msg, id string) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := c.store.AttachmentTarget(context.Background(), session.DefaultID, msg, id)
		if err != nil { // not admitted yet
			st.State = store.AttachmentPending
		}
		if st.State == store.AttachmentFetched {
			return
		}
		if st.State != store.AttachmentPending {
			b.Fatalf("attachment %s ended %s", id, st.State)
		}
		if time.Now().After(deadline) {
			b.Fatalf("attachment %s still pending", id)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BenchmarkDMDuringAttachmentFetch: the time from a DM's gateway dispatch
// to its admission (committed in klbr-core's store) while a 25 MB
// attachment is being fetched from the fake's CDN and streamed to klbr-core:
// unpaced, as before attachment_bytes_per_second (unpaced), and at the
// default pace (paced), against the same DM with nothing fetched (idle, the
// baseline). The fake Discord, klbr-discord's transport (its fetcher
// included) and a real klbr-core side (store, admission, ingress.sock,
// artifact spool) run in one process as in production, one rig unpaced and
// one paced. Each round measures the three one after the other, so that a
// change of the machine's load falls on all three alike; the figures are
// medians over the rounds, and the ratios are of medians. overlap is the
// share of fetching rounds in which the fetch was still under way when the
// DM was admitted (it must be 1 for the figure to mean anything); fetch-ms
// is a fetch's own time, from its message's dispatch to its artifact
// recorded.
func BenchmarkDMDuringAttachmentFetch(b *testing.B) {
	type rig struct {
		c       *core
		fake    *discordtest.Fake
		started chan struct{}
	}
	newRig := func(rate int64) *rig {
		r := &rig{c: startFetchBenchCore(b), fake: discordtest.New("99"), started: make(chan struct{}, 1)}
		b.Cleanup(r.fake.Close)
		r.fake.OnCDN = func(req *http.Request) {
			if strings.Contains(req.URL.Path, "big-") {
				select {
				case r.started <- struct{}{}:
				default:
				}
			}
		}
		runTransportWith(b, r.fake, r.c.socket, fetchBenchLimits(rate))
		return r
	}
	unpaced, paced := newRig(-1), newRig(DefaultBytesPerSecond)
	next := 40000000
	// dm sends a DM on r (after a 25 MB attachment's fetch has started, when
	// fetching) and returns the time to its admission, whether the fetch
	// was still under way then, and the fetch's own time.
	dm := func(r *rig, fetching bool) (admitted time.Duration, overlap bool, fetched time.Duration) {
		var msg, att string
		fetchAt := time.Now()
		if fetching {
			next++
			msg, att = fmt.Sprint(next), fmt.Sprint(next+500000000)
			r.fake.Dispatch("MESSAGE_CREATE", dmWith(msg, "the logs",
				r.fake.GeneratedAttachment(att, "20", msg, "big-"+msg+".bin", "application/octet-stream", 25<<20, time.Hour)))
			<-r.started
			// Let the first megabytes flow before the DM.
			time.Sleep(5 * time.Millisecond)
		}
		before := count(pending(b, r.c), "discord:61")
		next++
		at := time.Now()
		r.fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(next), "61", "", "6", "a question"))
		for count(pending(b, r.c), "discord:61") == before {
			time.Sleep(200 * time.Microsecond)
		}
		admitted = time.Since(at)
		if fetching {
			overlap = fetchState(b, r.c, msg, att).State == store.AttachmentPending
			settledFetch(b, r.c, msg, att)
			fetched = time.Since(fetchAt)
		}
		return admitted, overlap, fetched
	}
	var idleMS, unpacedMS, pacedMS, unpacedFetch, pacedFetch []float64
	var fetches, overlapped int
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for b.Loop() {
		d, _, _ := dm(unpaced, false)
		idleMS = append(idleMS, ms(d))
		d, o, f := dm(unpaced, true)
		unpacedMS, unpacedFetch = append(unpacedMS, ms(d)), append(unpacedFetch, ms(f))
		fetches++
		if o {
			overlapped++
		}
		d, o, f = dm(paced, true)
		pacedMS, pacedFetch = append(pacedMS, ms(d)), append(pacedFetch, ms(f))
		fetches++
		if o {
			overlapped++
		}
	}
	idle := median(idleMS)
	b.ReportMetric(idle, "idle-dm-ms")
	b.ReportMetric(median(unpacedMS), "unpaced-dm-ms")
	b.ReportMetric(median(pacedMS), "paced-dm-ms")
	b.ReportMetric(median(unpacedMS)/idle, "unpaced-x")
	b.ReportMetric(median(pacedMS)/idle, "paced-x")
	b.ReportMetric(median(unpacedFetch), "unpaced-fetch-ms")
	b.ReportMetric(median(pacedFetch), "paced-fetch-ms")
	b.ReportMetric(float64(overlapped)/float64(fetches), "overlap")
}

// median of xs (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// liveHeap samples the live heap (as the last collection marked it) while
// it runs, forcing a collection each time, and returns the highest seen.
type liveHeap struct {
	stop chan struct{}
	done chan uint64
}

func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	runtime.GC()
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func sampleLiveHeap() *liveHeap {
	h := &liveHeap{stop: make(chan struct{}), done: make(chan uint64, 1)}
	go func() {
		var peak uint64
		for {
			peak = max(peak, heapLive())
			select {
			case <-h.stop:
				h.done <- max(peak, heapLive())
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return h
}

func (h *liveHeap) peak() uint64 {
	close(h.stop)
	return <-h.done
}

// BenchmarkAttachmentFetchMemory: the bytes one attachment fetch holds in
// memory, for files of 1, 25 and 60 MB. The CDN makes each file as it
// serves it (the fake holds none of it), the fetcher streams it to
// klbr-core, which spools it to disk; all of it runs in this process.
// peak-live-MB is the highest live heap during the fetch less the live heap
// before it, sampled after a forced collection every few milliseconds; it
// must not grow with the file. B/op counts every byte allocated, garbage
// included.
func BenchmarkAttachmentFetchMemory(b *testing.B) {
	for _, v := range []struct {
		size int64
		rate int64
	}{{1 << 20, -1}, {25 << 20, -1}, {60 << 20, -1}, {25 << 20, DefaultBytesPerSecond}} {
		size := v.size
		name := fmt.Sprintf("%dMB", size>>20)
		if v.rate > 0 {
			name += "-paced"
		}
		b.Run(name, func(b *testing.B) {
			c := startFetchBenchCore(b)
			fake := discordtest.New("99")
			defer fake.Close()
			runTransportWith(b, fake, c.socket, fetchBenchLimits(v.rate))
			b.ReportAllocs()
			next := 50000000
			var peakTotal uint64
			var rounds int
			for b.Loop() {
				next++
				msg, att := fmt.Sprint(next), fmt.Sprint(next+500000000)
				b.StopTimer()
				base := heapLive()
				h := sampleLiveHeap()
				b.StartTimer()
				fake.Dispatch("MESSAGE_CREATE", dmWith(msg, "the file",
					fake.GeneratedAttachment(att, "20", msg, "file-"+msg+".bin", "application/octet-stream", size, time.Hour)))
				settledFetch(b, c, msg, att)
				b.StopTimer()
				p := h.peak()
				if p > base {
					peakTotal += p - base
				}
				rounds++
				b.StartTimer()
			}
			b.ReportMetric(float64(peakTotal)/float64(rounds)/(1<<20), "peak-live-MB")
		})
	}
}
