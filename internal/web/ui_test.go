package web

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/store"
)

// screenshot saves the page as name.png under $KLBR_ARTIFACTS (the CI's
// artifact directory), or the test's temporary directory, and logs where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100) /* 100: PNG */)
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	dir := os.Getenv("KLBR_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	t.Logf("screenshot: %s", path)
}

func poll(ctx context.Context, js string) error {
	return chromedp.Do(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(10*time.Second)))
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// The page renders each lane's kinds distinctly: a scratchpad with its
// reasoning and tool calls, a partial scratchpad marked interrupted (never
// as sent), cells joined by tool call with their outcomes, an unrun tool
// call, speech, every notice kind in words, and unknown kinds as generic
// records of their lane. Then a step streams: its deltas show a provisional
// preview that the step's record replaces.
func TestBrowserRendersTurnRecords(t *testing.T) {
	h := start(t)
	ctx := browserCtx(t)
	h.rawRecords(t, turnRecords(time.Now().Add(30*time.Second))...)
	if _, err := h.sessions.Transition(context.Background(), "default", store.StatePaused, "step budget: 40 model requests in this attempt"); err != nil {
		t.Fatal(err)
	}
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?view=lanes&token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#h-state').textContent === 'paused'`); err != nil {
		t.Fatalf("header state: %v", err)
	}
	lanes := eval[map[string]float64](t, ctx, `Object.fromEntries([...document.querySelectorAll('.lane')].map(l => [l.dataset.lane, l.querySelectorAll('.record').length]))`)
	want := map[string]float64{"input": 1, "scratchpad": 3, "cell": 4, "speech": 5, "notice": 11}
	for lane, n := range want {
		if lanes[lane] != n {
			t.Errorf("lane %s has %v records, want %v (all: %v)", lane, lanes[lane], n, lanes)
		}
	}
	text := func(sel string) string {
		return eval[string](t, ctx, `document.querySelector(`+"`"+sel+"`"+`).innerText`)
	}
	checks := []struct{ sel, want string }{
		{"#lane-input .items", "ada"},
		{"#lane-input .items", "how long are my notes?"},
		{"#lane-scratchpad .items", "I will read the file"},
		{"#lane-scratchpad .items", "1200 in · 80 out · 1024 cached tokens"},
		{"#lane-scratchpad .record.partial", "interrupted — partial, not sent"},
		{"#lane-scratchpad .record.partial", "I was about to say that the"},
		{"#lane-cell .record.st-ok", "output — 31 lines"},
		{"#lane-cell .record.st-error", "NameError: name 'x' is not defined"},
		{"#lane-cell .record.unrun", "not run: skipped"},
		{"#lane-cell .record.unrun", "an earlier call of the group waited"},
		{"#lane-cell .record.generic", "an unknown cell record"},
		{"#lane-speech .items", "Done: the notes have 1234 characters."},
		{"#lane-notice .items", "delivery reminder (frame 3): ada asked you something"},
		{"#lane-notice .items", "waiting 30 s, until"},
		{"#lane-notice .items", "woken by input after 4.2 s: an operator input"},
		{"#lane-notice .items", "model error (http_status) at step 1: 502 from the route — retrying in 2.0 s"},
		{"#lane-notice .items", "idle: nothing to do"},
		{"#lane-notice .items", "context reset: epoch 2 starts empty: reset by operator"},
		{"#lane-notice .items", "context over budget: needs 140000 tokens of 128000"},
		{"#lane-notice .record.n-pause", "paused: step budget: 40 model requests"},
		{"#lane-notice .items", "session ready → paused: step budget"},
		{"#lane-notice .record.generic", "a kind from the future"},
		{"#lane-notice .items", "resumed: restart"},
		{"#lane-speech .record.discord.sent", "Your notes have 1234 characters."},
		{"#lane-speech .record.discord.sent", "to d1 · as a reply"},
		{"#lane-speech .record.discord.sent", "delivered to Discord · message 99"},
		{"#lane-speech .record.discord.failed", "not delivered: 50013 Missing Permissions"},
		{"#lane-speech .record.discord.unknown", "delivery unknown: no echo and no message in history"},
		{"#lane-speech .items", "reaction 👍 on message m1"},
		{"#h-reason", "step budget: 40 model requests in this attempt"},
		{"#h-attempt", "#9"},
	}
	for _, c := range checks {
		if got := text(c.sel); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q does not contain %q", c.sel, got, c.want)
		}
	}
	// The scratchpad is never speech: nothing of it is in the speech lane.
	if s := text("#lane-speech .items"); strings.Contains(s, "I will read the file") || strings.Contains(s, "about to say") {
		t.Errorf("scratchpad text in the speech lane: %q", s)
	}
	cells := eval[map[string]any](t, ctx, `(() => { const c = [...document.querySelectorAll('#lane-cell .record')];
		return {highlighted: c[0].querySelectorAll('.kw').length > 0 && c[0].querySelectorAll('.com').length > 0,
		        collapsed: c[0].querySelector('details.long') !== null && !c[0].querySelector('details.long').open,
		        running: document.querySelectorAll('#lane-cell .outcome.running').length,
		        toolCode: document.querySelectorAll('#lane-scratchpad .tool-call pre.code .kw').length > 0}; })()`)
	if cells["highlighted"] != true || cells["collapsed"] != true || cells["running"] != 0.0 || cells["toolCode"] != true {
		t.Errorf("cells: %v (want highlighted code, long output collapsed, both cells finished, tool-call code highlighted)", cells)
	}
	screenshot(t, ctx, "browser-turn-records")

	// A step streams: the preview is provisional, its tool code highlighted
	// as it arrives; the record replaces it, and late deltas are ignored.
	// The page joins this stream at its third delta (indices 0 and 1 went
	// out before it connected).
	index := int64(2)
	pub := func(kind, text, call string) {
		h.deltas.Publish(live.Delta{Session: "default", Attempt: 10, Step: 1, Kind: kind, Text: text, Call: call, Index: index})
		index++
	}
	pub("reasoning", "The user wants a summary. ", "")
	pub("content", "Let me look at ", "")
	pub("content", "the file first.", "")
	pub("tool", `{"code": "import os\nprint(os.listdir(`, "call_z")
	// The first delta it saw was not the stream's first: it says so.
	if err := poll(ctx, `(() => { const p = document.querySelector('#lane-scratchpad .record.preview');
		return p && p.innerText.includes('Let me look at the file first.') && p.innerText.includes('provisional')
		  && p.innerText.includes('joined mid-stream') && p.querySelector('pre.code .kw') !== null; })()`); err != nil {
		t.Fatalf("preview: %v; scratchpad lane: %s", err, text("#lane-scratchpad .items"))
	}
	screenshot(t, ctx, "browser-delta-preview")
	pub("end", "", "")
	h.rawRecords(t, rawRecord{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 10, "step": 1, "route": "main",
		"text": "Let me look at the file first.", "tool_calls": []map[string]any{{"id": "call_z", "name": "python", "arguments": `{"code":"import os\nprint(os.listdir('.'))"}`}}}})
	h.nudge(t)
	if err := poll(ctx, `document.querySelector('#lane-scratchpad .record.preview') === null &&
		[...document.querySelectorAll('#lane-scratchpad .record')].filter(r => r.innerText.includes('attempt 10 · step 1')).length === 1`); err != nil {
		t.Fatalf("the record did not replace the preview: %v; lane: %s", err, text("#lane-scratchpad .items"))
	}
	pub("content", "a late delta", "")
	time.Sleep(300 * time.Millisecond)
	if s := text("#lane-scratchpad .items"); strings.Contains(s, "a late delta") {
		t.Errorf("a delta after its record was shown: %q", s)
	}
	if n := eval[float64](t, ctx, `document.querySelectorAll('#lane-scratchpad .record').length`); n != 4 {
		t.Errorf("%v scratchpad records, want 4", n)
	}
	// The next step's stream is seen from its start: its preview is whole.
	// A tool call's later deltas carry no call id and continue it.
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 10, Step: 2, Kind: "content", Text: "Next."})
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 10, Step: 2, Kind: "tool", Call: "call_y", Text: `{"code": "1 +`, Index: 1})
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 10, Step: 2, Kind: "tool", Text: ` 1"}`, Index: 2})
	if err := poll(ctx, `(() => { const p = document.querySelector('#lane-scratchpad .record.preview');
		return p && p.innerText.includes('Next.') && !p.classList.contains('joined')
		  && p.querySelectorAll('.tool-call').length === 1 && p.querySelector('.tool-call pre').innerText === '1 + 1'; })()`); err != nil {
		t.Fatalf("second preview: %v; lane: %s", err, text("#lane-scratchpad .items"))
	}
	// A step that streamed nothing (a failed request, an empty completion)
	// ends without a preview.
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 11, Step: 1, Kind: "end"})
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 11, Step: 2, Kind: "gap"})
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 11, Step: 3, Kind: "content", Text: "marker"})
	if err := poll(ctx, `[...document.querySelectorAll('#lane-scratchpad .record.preview')].some(p => p.innerText.includes('marker'))`); err != nil {
		t.Fatal(err)
	}
	if n := eval[float64](t, ctx, `document.querySelectorAll('#lane-scratchpad .record.preview').length`); n != 2 {
		t.Errorf("%v previews, want 2 (steps 10:2 and 11:3; none for a bare end or gap)", n)
	}
}

// A page loaded on a long session replays it fast enough to use: 10,000
// records in their lanes, each once, and the page live.
func TestBrowserReplaysTenThousandRecords(t *testing.T) {
	h := start(t)
	for i := range 20 { // 20 full pages: the replay ends on a page boundary
		h.admitN(t, 500, "r"+itoa(i), 100)
	}
	ctx := browserCtx(t)
	// By default a fresh page shows the last 2,000 records and says how
	// many it leaves out; its link asks for more.
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?view=lanes&token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := eval[float64](t, ctx, `document.querySelectorAll('.record').length`); n != 2000 {
		t.Fatalf("%v records on a default page, want the last 2000", n)
	}
	if s := eval[string](t, ctx, `document.querySelector('#earlier').hidden ? '' : document.querySelector('#earlier').innerText`); !strings.Contains(s, "8000 earlier records not shown") || !strings.Contains(s, "Show 8000") {
		t.Fatalf("the earlier-records note: %q", s)
	}
	if first := eval[string](t, ctx, `document.querySelector('#lane-input .record .text, #lane-input .record').innerText`); !strings.Contains(first, "r16") {
		t.Fatalf("the first record shown is not from the last 2000: %q", first)
	}
	screenshot(t, ctx, "browser-tail-snapshot")
	t0 := time.Now()
	err = chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?view=lanes&token="+testToken+"&tail=20000"),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if !eval[bool](t, ctx, `document.querySelector('#earlier').hidden`) {
		t.Fatal("a page that shows everything says records are left out")
	}
	n := eval[float64](t, ctx, `new Set([...document.querySelectorAll('#lane-input .record')].map(e => e.dataset.id)).size`)
	all := eval[float64](t, ctx, `document.querySelectorAll('.record').length`)
	if n != 10000 || all != 10000 {
		t.Fatalf("%v distinct inputs and %v records shown, want 10000", n, all)
	}
	t.Logf("10,000 records replayed and rendered: the page is live %v after navigation", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("the page took %v to replay 10,000 records", took)
	}
	screenshot(t, ctx, "browser-10000")
}

// A traced step's record shows its trace: a link into the operator's trace
// viewer when [telemetry] trace_url is set, else the id as text; an id
// that is not a trace id is not shown.
func TestBrowserLinksTraces(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		name, traceURL, wantHref string
	}{
		{"trace_url set", `https://grafana.example/explore?left={"queries":[{"query":"{trace_id}"}]}&x=<b>`,
			`https://grafana.example/explore?left={%22queries%22:[{%22query%22:%22` + id + `%22}]}&x=%3Cb%3E`},
		{"no trace_url", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startWith(t, func(_ *harness, b *Browser) { b.TraceURL = tc.traceURL })
			ctx := browserCtx(t)
			h.rawRecords(t,
				rawRecord{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 3, "step": 1, "trace_id": id, "text": "traced", "tool_calls": []any{}}},
				rawRecord{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 4, "step": 1, "trace_id": `"><img src=x>`, "text": "odd", "tool_calls": []any{}}})
			if err := chromedp.Do(ctx,
				chromedp.Navigate(h.http.URL+"/?view=lanes&token="+testToken),
				chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
			); err != nil {
				t.Fatal(err)
			}
			if err := poll(ctx, `document.querySelectorAll('#lane-scratchpad .record').length === 2`); err != nil {
				t.Fatal(err)
			}
			got := eval[map[string]any](t, ctx, `(() => { const a = document.querySelector('#lane-scratchpad .trace a');
				return {traces: document.querySelectorAll('#lane-scratchpad .trace').length,
				        text: document.querySelector('#lane-scratchpad .trace').innerText,
				        href: a ? a.href : "", target: a ? a.target : "", rel: a ? a.rel : ""}; })()`)
			if got["traces"] != 1.0 || got["text"] != "trace "+id || got["href"] != tc.wantHref {
				t.Errorf("trace shown as %v, want one %q linking %q", got, "trace "+id, tc.wantHref)
			}
			if tc.wantHref != "" && (got["target"] != "_blank" || got["rel"] != "noopener noreferrer") {
				t.Errorf("the link opens as %v", got)
			}
			// The conversation view: the work block links each attempt's
			// trace without being opened.
			if err := chromedp.Do(ctx,
				chromedp.Navigate(h.http.URL+"/?token="+testToken),
				chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
			); err != nil {
				t.Fatal(err)
			}
			if err := poll(ctx, `document.querySelectorAll('article.entry.work').length === 1`); err != nil {
				t.Fatal(err)
			}
			conv := eval[map[string]any](t, ctx, `(() => { const w = document.querySelector('article.entry.work');
				const a = w.querySelector('.work-traces .trace a');
				return {traces: w.querySelectorAll('.work-traces .trace').length, open: w.classList.contains('open'),
				        text: (w.querySelector('.work-traces') || {}).innerText || "", href: a ? a.href : ""}; })()`)
			if conv["traces"] != 1.0 || conv["open"] != false || conv["text"] != "attempt 3 · trace "+id || conv["href"] != tc.wantHref {
				t.Errorf("the conversation's work block shows %v, want attempt 3's trace linking %q", conv, tc.wantHref)
			}
		})
	}
}

// Records whose originals retention collected read as collected, with
// the date and the reason, in the conversation (an input, a work block's
// step and a cell's outcome) and in the lanes; never as empty text or as
// the stub's JSON.
func TestBrowserShowsCollectedRecords(t *testing.T) {
	h := start(t)
	ctx := browserCtx(t)
	h.rawRecords(t,
		rawRecord{store.LaneInput, "operator.input", map[string]any{"text": "kept input", "source_kind": "operator"}},
		rawRecord{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 1, "step": 1, "text": "kept step", "tool_calls": []any{}}},
		rawRecord{store.LaneCell, "cell.started", map[string]any{"code": "print(1)", "generation": 1, "tool_call_id": "c1"}},
		rawRecord{store.LaneCell, "cell.finished", map[string]any{"status": "ok", "generation": 1, "tool_call_id": "c1"}},
	)
	// Collect the input, the step and the cell's outcome as migration 0025
	// does (a raw record has no summary, so the schema's trigger is lifted
	// for the test's one transaction).
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(h.dir, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	at := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC).UnixMilli()
	const reason = "retention.history_days = 90: test"
	for _, q := range []string{`DROP TRIGGER events_append_only_update`,
		fmt.Sprintf(`UPDATE events SET content = json_object('collected', json_object('at', %d, 'reason', '%s')),
			collected_at = %d, collected_reason = '%s', collected_bytes = 10 WHERE kind IN ('operator.input', 'scratchpad', 'cell.finished')`, at, reason, at, reason)} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	const want = "collected by retention on 2026-01-02: " + reason
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('article.entry').length >= 2`); err != nil {
		t.Fatal(err)
	}
	// Open the work block.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`article.entry.work .work-head`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('article.entry.work .collected-note').length === 2`); err != nil {
		t.Fatalf("the opened work block: %v\n%s", err, eval[string](t, ctx, `document.querySelector('article.entry.work').innerText`))
	}
	conv := eval[map[string]string](t, ctx, `({input: document.querySelector('article.entry.msg.in').innerText,
		work: document.querySelector('article.entry.work').innerText})`)
	if !strings.Contains(conv["input"], want) || strings.Contains(conv["input"], `"collected"`) {
		t.Errorf("the conversation's input: %q", conv["input"])
	}
	if strings.Count(conv["work"], want) != 2 || !strings.Contains(conv["work"], "print(1)") || strings.Contains(conv["work"], `"collected"`) ||
		strings.Contains(conv["work"], "running") {
		t.Errorf("the conversation's work block: %q", conv["work"])
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?view=lanes&token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('.collected-note').length === 3 && !document.querySelector('#lane-cell .outcome.running')`); err != nil {
		t.Fatalf("lanes: %v", err)
	}
	for _, lane := range []string{"input", "scratchpad", "cell"} {
		got := eval[string](t, ctx, `document.querySelector('#lane-`+lane+` .items').innerText`)
		if !strings.Contains(got, want) {
			t.Errorf("lane %s: %q", lane, got)
		}
	}
}
