package web

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// BenchmarkReplayMemory is the outside test's replay load: 50 browsers replay, at once,
// a session of 2,000 records of 64 KiB each (the largest input), reading as fast as they
// can. It reports the daemon side's peak Go heap and the process's peak RSS growth during
// the replays (MB), and the heap after they end and a GC. Run it with -benchtime=1x.
func BenchmarkReplayMemory(b *testing.B) {
	const clients, records, size = 50, 2000, 64 << 10
	h := start(b)
	for i := range records / 100 {
		h.admitN(b, 100, fmt.Sprintf("m%d", i), size-16)
	}
	for range b.N {
		runtime.GC()
		var idle runtime.MemStats
		runtime.ReadMemStats(&idle)
		os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // resets VmHWM to the current RSS
		rss0 := procStatusKB("VmRSS")
		var peakHeap atomic.Uint64
		stop := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Go(func() {
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			for {
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peakHeap.Load() {
					peakHeap.Store(m.HeapInuse)
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		})
		var wg sync.WaitGroup
		var failed atomic.Value
		for range clients {
			wg.Go(func() {
				if err := replayAll(h, records); err != nil {
					failed.Store(err)
				}
			})
		}
		wg.Wait()
		close(stop)
		sampler.Wait()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		peakRSS := procStatusKB("VmHWM")
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(peakHeap.Load())/(1<<20), "peak-heap-MB")
		b.ReportMetric(float64(peakRSS-rss0)/1024, "peak-rss-growth-MB")
		b.ReportMetric(float64(idle.HeapInuse)/(1<<20), "idle-heap-MB")
		b.ReportMetric(float64(after.HeapInuse)/(1<<20), "after-heap-MB")
	}
}

// replayAll connects, asks for the snapshot of the last n records and reads until the
// replay says it is complete, decoding only the envelope.
func replayAll(h *harness, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hdr := map[string][]string{"Cookie": {CookieName + "=" + testToken}}
	c, _, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		return err
	}
	defer c.CloseNow()
	c.SetReadLimit(64 << 20)
	hello, _ := json.Marshal(map[string]any{"type": "hello", "session": "default", "cursor": 0, "tail": n})
	if err := c.Write(ctx, websocket.MessageText, hello); err != nil {
		return err
	}
	got := 0
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return fmt.Errorf("after %d records: %w", got, err)
		}
		var m struct {
			Type    string            `json:"type"`
			Records []json.RawMessage `json:"records"`
			More    bool              `json:"more"`
		}
		if json.Unmarshal(b, &m) != nil || m.Type != "records" {
			continue
		}
		got += len(m.Records)
		if !m.More && got >= n {
			return nil
		}
	}
}

func procStatusKB(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
