package discord

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/metrics"
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
func fetchBenchLimits(cfg *Config) {
	cfg.Probe.Interval = -1
	cfg.Flood = FloodLimits{Off: true}
	cfg.Fetch = FetchLimits{MaxBytes: 64 << 20, Timeout: 5 * time.Minute, BytesPerHour: 1 << 50}
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
// to its admission (committed in klbr-core's store), with a 25 MB
// attachment being fetched from the fake's CDN and streamed to klbr-core at
// that moment (fetching-25MB), against the same DM with nothing fetched
// (idle, the baseline). The fake Discord, klbr-discord's transport (its
// fetcher included) and a real klbr-core side (store, admission,
// ingress.sock, artifact spool) run in one process as in production.
// overlap is the share of rounds in which the fetch was still under way
// when the DM was admitted (it must be 1 for the figure to mean anything);
// fetch-ms is the fetch's own time, from its message's dispatch to its
// artifact recorded.
func BenchmarkDMDuringAttachmentFetch(b *testing.B) {
	for _, fetching := range []bool{false, true} {
		name := "idle"
		if fetching {
			name = "fetching-25MB"
		}
		b.Run(name, func(b *testing.B) {
			c := startFetchBenchCore(b)
			fake := discordtest.New("99")
			defer fake.Close()
			started := make(chan struct{}, 1)
			fake.OnCDN = func(r *http.Request) {
				if strings.Contains(r.URL.Path, "big-") {
					select {
					case started <- struct{}{}:
					default:
					}
				}
			}
			runTransportWith(b, fake, c.socket, fetchBenchLimits)
			next := 40000000
			var total, fetchTotal time.Duration
			var rounds, overlapped int
			for b.Loop() {
				var msg, att string
				fetchAt := time.Now()
				if fetching {
					next++
					msg, att = fmt.Sprint(next), fmt.Sprint(next+500000000)
					fake.Dispatch("MESSAGE_CREATE", dmWith(msg, "the logs",
						fake.GeneratedAttachment(att, "20", msg, "big-"+msg+".bin", "application/octet-stream", 25<<20, time.Hour)))
					<-started
					// Let the first megabytes flow before the DM.
					time.Sleep(5 * time.Millisecond)
				}
				before := count(pending(b, c), "discord:61")
				next++
				at := time.Now()
				fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(next), "61", "", "6", "a question"))
				for count(pending(b, c), "discord:61") == before {
					time.Sleep(200 * time.Microsecond)
				}
				total += time.Since(at)
				rounds++
				if fetching {
					if fetchState(b, c, msg, att).State == store.AttachmentPending {
						overlapped++
					}
					b.StopTimer()
					settledFetch(b, c, msg, att)
					fetchTotal += time.Since(fetchAt)
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(rounds), "dm-ms")
			b.ReportMetric(float64(overlapped)/float64(rounds), "overlap")
			b.ReportMetric(float64(fetchTotal.Microseconds())/1000/float64(rounds), "fetch-ms")
		})
	}
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
	for _, size := range []int64{1 << 20, 25 << 20, 60 << 20} {
		b.Run(fmt.Sprintf("%dMB", size>>20), func(b *testing.B) {
			c := startFetchBenchCore(b)
			fake := discordtest.New("99")
			defer fake.Close()
			runTransportWith(b, fake, c.socket, fetchBenchLimits)
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
