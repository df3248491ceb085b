package web

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/store"
)

// seedTurns writes turns of four records each: an operator input, a cell
// (started and finished) and a delivered message, like a session that ran
// for months.
func (h *harness) seedTurns(t testing.TB, turns int) {
	t.Helper()
	now := time.Now()
	for done := 0; done < turns; {
		n := min(2000, turns-done)
		err := h.st.Write(context.Background(), func(tx *store.Tx) error {
			gen, err := tx.NextKernelGeneration("default", nil)
			if err != nil {
				return err
			}
			for i := done; i < done+n; i++ {
				if _, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator", SourceKey: fmt.Sprintf("t-%d", i),
					Conversation: "operator", Author: "operator", OccurredAt: now, ReceivedAt: now,
					Body: fmt.Sprintf("question %d: what about the **report** for week %d?", i, i%52)}); err != nil {
					return err
				}
				id, _, err := tx.StartExecution("default", gen, fmt.Sprintf("rows = load(%d)\nlen(rows)", i), nil)
				if err != nil {
					return err
				}
				out, _ := json.Marshal(map[string]any{"status": "ok", "generation": gen, "value": fmt.Sprint(i * 7)})
				if err := tx.FinishExecution("default", id, "ok", false, out); err != nil {
					return err
				}
				if _, err := tx.RecordLocalSend(store.LocalSend{Session: "default", Execution: id, Request: 1,
					Text: fmt.Sprintf("answer %d: the report has `%d` rows.", i, i*7), Status: "confirmed", Reason: "fine", Epoch: 1}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		done += n
	}
}

// pageFigures are what a page load costs, measured in the page.
type pageFigures struct {
	FirstRenderMs float64 `json:"first"`   // navigation start to the frame after catching up
	HeapMB        float64 `json:"heap"`    // used JS heap after a GC-free settle
	Nodes         float64 `json:"nodes"`   // DOM elements
	Entries       float64 `json:"entries"` // conversation entries in the DOM
	Total         float64 `json:"total"`   // conversation entries in the model
}

const figuresJS = `({first: (performance.getEntriesByName('klbr-first-render')[0] || {startTime: -1}).startTime,
	heap: performance.memory ? performance.memory.usedJSHeapSize / 1048576 : -1,
	nodes: document.getElementsByTagName('*').length,
	entries: document.querySelectorAll('#conv .entry').length,
	total: conv.list.entries.length})`

// loadPage opens the conversation view with every record and waits for it.
func loadPage(ctx context.Context, url, query string, records int) (pageFigures, error) {
	var f pageFigures
	err := chromedp.Do(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/?token=%s&tail=%d%s", url, testToken, records, query)),
		chromedp.Poll[chromedp.Void](`performance.getEntriesByName('klbr-first-render').length === 1`, chromedp.WithPollingTimeout(120*time.Second)),
	)
	if err != nil {
		return f, err
	}
	f, err = chromedp.Run(ctx, chromedp.Evaluate[pageFigures](figuresJS))
	return f, err
}

// scrollFrames scrolls the conversation from the bottom to the top in
// steps, one per frame, and back, and returns the frame intervals (ms).
const scrollFramesJS = `new Promise((resolve) => {
	const sc = document.getElementById('conv');
	const frames = [];
	let last = performance.now(), dir = -1, steps = 0;
	const step = () => {
		const now = performance.now();
		frames.push(now - last);
		last = now;
		sc.scrollTop += dir * Math.max(sc.clientHeight, sc.scrollHeight / 60);
		steps++;
		if (dir < 0 && sc.scrollTop <= 0 && steps > 5) { dir = 1; }
		else if (dir > 0 && sc.scrollTop + sc.clientHeight >= sc.scrollHeight - 2) { resolve(frames); return; }
		if (steps > 4000) { resolve(frames); return; }
		requestAnimationFrame(step);
	};
	requestAnimationFrame(step);
})`

// A 100,000-record session in the conversation view: every record is in
// the model, the DOM stays bounded, and the page scrolls to the first
// record and back; the oldest record is reachable.
func TestBrowserHundredThousandRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 100,000 records")
	}
	h := start(t)
	h.seedTurns(t, 25000)
	ctx, _ := browserWith(t, t.TempDir(), 1280, 900)
	ctx, cancel := context.WithTimeout(ctx, 55*time.Second)
	defer cancel()
	f, err := loadPage(ctx, h.http.URL, "", 200000) // all of them
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("100,000 records: first render %.0f ms, heap %.1f MB, %v DOM elements, %v of %v entries rendered", f.FirstRenderMs, f.HeapMB, f.Nodes, f.Entries, f.Total)
	// 25,000 inputs and 25,000 sends; the cells form a work block between each.
	if f.Total < 74990 || f.Total > 75020 {
		t.Errorf("%v conversation entries, want 75000 (an input, its work and its answer for each of 25,000 turns)", f.Total)
	}
	if f.Entries > 300 || f.Nodes > 6000 {
		t.Errorf("the DOM is not bounded: %v entries, %v elements", f.Entries, f.Nodes)
	}
	screenshot(t, ctx, "home-10-100k-bottom")
	frames, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](scrollFramesJS, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	var worst, sum float64
	for _, d := range frames {
		worst = max(worst, d)
		sum += d
	}
	t.Logf("scrolled to the first record and back in %d frames: mean %.1f ms, worst %.1f ms", len(frames), sum/float64(len(frames)), worst)
	// The top holds the first turn.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(() => { const sc = document.getElementById('conv'); sc.scrollTop = 0; return true; })()`),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#conv .entry.in')].some(e => e.innerText.includes('question 0:'))`,
			chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the first record is not reachable: %v", err)
	}
	if n := eval[float64](t, ctx, `document.querySelectorAll('#conv .entry').length`); n > 300 {
		t.Errorf("%v entries in the DOM at the top", n)
	}
	screenshot(t, ctx, "home-11-100k-top")
}

// BenchmarkBrowserHome measures the page in headless Chromium: time to
// first render and heap with 10,000 and 100,000 records (the conversation
// view; the lanes view at 10,000 is the baseline: the page before the
// conversation), input-to-echo latency, and frame time while token deltas
// stream. Each figure is the mean over b.N page loads (or probes).
//
//	go test -run '^$' -bench BenchmarkBrowserHome -benchtime 3x ./internal/web/
func BenchmarkBrowserHome(b *testing.B) {
	for _, tc := range []struct {
		name  string
		turns int
		lanes bool
	}{{"lanes/records=10000", 2500, true}, {"conversation/records=10000", 2500, false}, {"conversation/records=100000", 25000, false}} {
		b.Run(tc.name, func(b *testing.B) {
			h := start(b)
			h.seedTurns(b, tc.turns)
			ctx, _ := browserWith(b, b.TempDir(), 1280, 900)
			view := ""
			if tc.lanes {
				view = "&view=lanes"
			}
			var first, heap, nodes float64
			for b.Loop() {
				ctx, cancel := context.WithTimeout(ctx, 50*time.Second)
				f, err := loadPage(ctx, h.http.URL, view, 200000)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				first += f.FirstRenderMs
				heap += f.HeapMB
				nodes += f.Nodes
			}
			n := float64(b.N)
			b.ReportMetric(first/n, "ms-first-render")
			b.ReportMetric(heap/n, "MB-heap")
			b.ReportMetric(nodes/n, "dom-elements")
			b.ReportMetric(0, "ns/op")
		})
	}
	b.Run("echo", func(b *testing.B) {
		h := start(b)
		ctx, _ := browserWith(b, b.TempDir(), 1280, 900)
		if _, err := loadPage(ctx, h.http.URL, "", 2000); err != nil {
			b.Fatal(err)
		}
		var sum float64
		i := 0
		for b.Loop() {
			i++
			ms, err := chromedp.Run(ctx, chromedp.Evaluate[float64](fmt.Sprintf(`new Promise((resolve) => {
				const box = document.getElementById('composer');
				box.value = 'echo probe %d';
				const t0 = performance.now();
				const obs = new MutationObserver(() => {
					if ([...document.querySelectorAll('#conv .entry.in')].some(e => e.innerText.includes('echo probe %d'))) { obs.disconnect(); resolve(performance.now() - t0); }
				});
				obs.observe(document.getElementById('conv'), {childList: true, subtree: true});
				box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
			})`, i, i), chromedp.EvalAwaitPromise))
			if err != nil {
				b.Fatal(err)
			}
			sum += ms
		}
		b.ReportMetric(sum/float64(b.N), "ms-echo")
		b.ReportMetric(0, "ns/op")
	})
	// The page's own cost of a delta (the handler and the layout it forces),
	// lanes (the page before, as baseline) against the conversation.
	for _, view := range []string{"lanes", "conversation"} {
		b.Run("delta-cost/"+view, func(b *testing.B) {
			h := start(b)
			h.seedTurns(b, 500) // 2,000 records: a default page
			ctx, _ := browserWith(b, b.TempDir(), 1280, 900)
			q := ""
			if view == "lanes" {
				q = "&view=lanes"
			}
			if _, err := loadPage(ctx, h.http.URL, q, 200000); err != nil {
				b.Fatal(err)
			}
			var sum float64
			attempt := 100
			for b.Loop() {
				attempt++
				ms, err := chromedp.Run(ctx, chromedp.Evaluate[float64](fmt.Sprintf(`(() => { const t0 = performance.now();
					for (let i = 0; i < 300; i++) { const items = laneItems("scratchpad"); const st = view === "lanes" && atBottom(items);
						applyDelta({attempt: %d, step: 1, kind: "content", text: "some more words ", index: i});
						if (st) items.scrollTop = items.scrollHeight; }
					return performance.now() - t0; })()`, attempt)))
				if err != nil {
					b.Fatal(err)
				}
				sum += ms / 300
			}
			b.ReportMetric(sum/float64(b.N), "ms/delta")
			b.ReportMetric(0, "ns/op")
		})
	}
	b.Run("deltas/conversation", func(b *testing.B) {
		h := start(b)
		h.seedTurns(b, 500) // 2,000 records: a default page
		ctx, _ := browserWith(b, b.TempDir(), 1280, 900)
		if _, err := loadPage(ctx, h.http.URL, "", 200000); err != nil {
			b.Fatal(err)
		}
		var mean, p95 float64
		attempt := 100
		for b.Loop() {
			attempt++
			// The page records frame intervals while a step streams 1,000
			// deltas of a few words each, one every 2 ms (a fast model).
			if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(window.klbrFrames = [], (() => { let last = performance.now();
				const f = () => { const now = performance.now(); window.klbrFrames.push(now - last); last = now; if (window.klbrFrames.length < 100000) requestAnimationFrame(f); };
				requestAnimationFrame(f); })(), true)`)); err != nil {
				b.Fatal(err)
			}
			for i := range 1000 {
				h.deltas.Publish(live.Delta{Session: "default", Attempt: int64(attempt), Step: 1, Kind: "content", Text: "some more words ", Index: int64(i)})
				time.Sleep(2 * time.Millisecond)
			}
			frames, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => { const f = window.klbrFrames.slice(1); window.klbrFrames = [1e9]; return f; })()`))
			if err != nil || len(frames) == 0 {
				b.Fatal(err, len(frames))
			}
			sort.Float64s(frames)
			var s float64
			for _, d := range frames {
				s += d
			}
			mean += s / float64(len(frames))
			p95 += frames[len(frames)*95/100]
		}
		b.ReportMetric(mean/float64(b.N), "ms-frame-mean")
		b.ReportMetric(p95/float64(b.N), "ms-frame-p95")
		b.ReportMetric(0, "ns/op")
	})
}
