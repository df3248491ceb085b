package web

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/store"
)

// chromiumPath finds Debian's chromium (KLBR_CHROMIUM overrides).
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KLBR_CHROMIUM"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	citest.SkipOrFail(t, "chromium is not installed (apt-get install chromium); the browser end-to-end test needs it")
	return ""
}

// browserCtx starts headless Chromium with a temporary profile.
func browserCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, _ := browserWith(t, t.TempDir(), 1400, 900)
	return ctx
}

// browserWith starts headless Chromium with the profile directory and window
// size given; stop ends it (as closing the browser does), and so does the
// test's end.
func browserWith(t testing.TB, profile string, w, h int) (context.Context, func()) {
	t.Helper()
	path := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(w, h),
		chromedp.Flag("enable-precise-memory-info", true),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	// Cancel closes the browser gracefully: it writes its profile (cookies) as a
	// browser the operator closes does.
	var once sync.Once
	stop := func() { once.Do(func() { chromedp.Cancel(ctx); cancelC(); cancelA() }) }
	t.Cleanup(stop)
	ctx, cancelT := context.WithTimeout(ctx, 180*time.Second)
	t.Cleanup(cancelT)
	if err := chromedp.Do(ctx); err != nil {
		citest.SkipOrFail(t, "chromium does not start: "+err.Error())
	}
	return ctx, stop
}

func TestBrowserEndToEnd(t *testing.T) {
	h := start(t)
	h.admitN(t, 1, "earlier", 0) // replayed on load
	ctx := browserCtx(t)
	base := h.http.URL

	const text = "hello from chromium"
	type css = chromedp.CSS
	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?view=lanes&token="+testToken),
		chromedp.WaitVisible(css(`#composer`)),
		chromedp.WaitVisible(css(`#h-conn[data-state="live"]`)),
		chromedp.WaitVisible(css(`#lane-input .record`)),
	)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	url, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || strings.Contains(url, "token=") {
		t.Errorf("the token stayed in the URL: %s %v", url, err)
	}
	// Shift+Enter is a newline, Enter sends.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#composer`)),
		chromedp.SendKeys(css(`#composer`), text+kb.Enter),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#lane-input .record .text')].some(e => e.textContent === "hello from chromium")`,
			chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Poll[chromedp.Void](`document.getElementById('composer').value === ""`, chromedp.WithPollingTimeout(5*time.Second)),
	)
	if err != nil {
		t.Fatalf("send with Enter: %v", err)
	}
	inputs, err := chromedp.Run(ctx, chromedp.Text(css(`#lane-input .items`)))
	if err != nil || !strings.Contains(inputs, "earlier-0") {
		t.Errorf("the replayed input is missing from the input lane: %q %v", inputs, err)
	}
	// The input is durable, once.
	recs, err := h.st.Records(context.Background(), "default", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	durable := 0
	for _, r := range recs {
		if r.Lane == "input" && strings.Contains(string(r.Content), `"text":"`+text+`"`) {
			durable++
		}
	}
	if durable != 1 {
		t.Fatalf("%d durable records of the sent input, want 1", durable)
	}
	// Reload: the page replays from cursor 0 and shows the input once.
	err = chromedp.Do(ctx,
		chromedp.Reload(),
		chromedp.WaitVisible(css(`#h-conn[data-state="live"]`)),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#lane-input .record').length >= 2`, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Sleep(300*time.Millisecond), // let any duplicate arrive
	)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	count, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll('#lane-input .record .text')].filter(e => e.textContent === "hello from chromium").length`))
	if err != nil || count != 1 {
		t.Fatalf("after reload the input shows %d times, want once (%v)", count, err)
	}
	lanes, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]int](`Object.fromEntries([...document.querySelectorAll('.lane')].map(l => [l.dataset.lane, l.querySelectorAll('.record').length]))`))
	if err != nil {
		t.Fatal(err)
	}
	if lanes["input"] != 2 || lanes["cell"] != 0 || lanes["speech"] != 0 || lanes["scratchpad"] != 0 || lanes["notice"] != 0 {
		t.Errorf("lane counts %v, want 2 inputs and nothing elsewhere", lanes)
	}
	// Shift+Enter is a newline, not a send; Enter then sends both lines.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#composer`)),
		chromedp.SendKeys(css(`#composer`), "two"),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.KeyEvent("lines"),
		chromedp.Poll[chromedp.Void](`document.getElementById('composer').value === "two\nlines"`, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Sleep(200*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("Shift+Enter: %v", err)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#lane-input .record').length`)); n != 2 {
		t.Fatalf("Shift+Enter sent: %d inputs shown", n)
	}
	err = chromedp.Do(ctx,
		chromedp.KeyEvent(kb.Enter),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#lane-input .record .text')].some(e => e.textContent === "two\nlines")`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("multi-line send: %v", err)
	}

	// Live cells and notices land in their own lanes; a cell's outcome joins
	// its code.
	err = h.st.Write(context.Background(), func(tx *store.Tx) error {
		gen, err := tx.NextKernelGeneration("default", nil)
		if err != nil {
			return err
		}
		id, _, err := tx.StartExecution("default", gen, "import math\n# the answer\nprint(math.sqrt(2))\nx = \"<b>not bold</b>\"", nil)
		if err != nil {
			return err
		}
		long := strings.Repeat("line of output\n", 40)
		outcome, _ := json.Marshal(map[string]any{"status": "ok", "generation": gen, "value": "42",
			"output": map[string]any{"preview": []map[string]string{{"stream": "stdout", "origin": "execution", "data": long}}}})
		if err := tx.FinishExecution("default", id, "ok", false, outcome); err != nil {
			return err
		}
		if _, err := tx.RecordLocalSend(store.LocalSend{Session: "default", Execution: id, Request: 1, Text: "hello there", Status: "confirmed", Reason: "fine", Epoch: 1}); err != nil {
			return err
		}
		if _, err := tx.RecordLocalSend(store.LocalSend{Session: "default", Execution: id, Request: 2, Text: "<i>not yet</i>", Status: "held", Reason: "review bug", Epoch: 1, Fallback: true}); err != nil {
			return err
		}
		return tx.KernelReset("default", gen, "operator reset")
	})
	if err != nil {
		t.Fatal(err)
	}
	err = chromedp.Do(ctx,
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#lane-notice .record').length === 2 && document.querySelector('#lane-cell .outcome.ok') !== null`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("cell and notices: %v", err)
	}
	cell, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`(() => { const c = document.querySelectorAll('#lane-cell .record');
		return {n: c.length, kw: c[0].querySelectorAll('.kw').length, bold: c[0].querySelectorAll('b').length,
		        collapsed: c[0].querySelector('details') !== null && !c[0].querySelector('details').open,
		        text: document.querySelector('#lane-notice .items').innerText}; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if cell["n"] != 1.0 || cell["kw"] == 0.0 || cell["bold"] != 0.0 || cell["collapsed"] != true ||
		!strings.Contains(cell["text"].(string), "kernel reset") {
		t.Errorf("cell lane: %v (want one highlighted cell, no injected markup, long output collapsed, a reset notice)", cell)
	}
	speech, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`(() => { const s = document.querySelectorAll('#lane-speech .record');
		return {n: s.length, held: document.querySelectorAll('#lane-speech .record.held').length,
		        italic: document.querySelectorAll('#lane-speech i').length,
		        text: document.querySelector('#lane-speech .items').innerText}; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if speech["n"] != 2.0 || speech["held"] != 1.0 || speech["italic"] != 0.0 ||
		!strings.Contains(speech["text"].(string), "held by the host (the review did not decide): review bug") {
		t.Errorf("speech lane: %v (want a sent card and a held card with its reason, no injected markup)", speech)
	}
	if shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		if dir := os.Getenv("KLBR_ARTIFACTS"); dir != "" {
			os.WriteFile(filepath.Join(dir, "browser-e2e.png"), shot, 0o644)
		}
	}

	// Keys: ? shows them, Esc hides them; Ctrl+. pauses the session at
	// once, even from the input box.
	err = chromedp.Do(ctx,
		chromedp.Poll[chromedp.Void](`(document.activeElement.blur(), true)`),
		chromedp.KeyEvent("?"),
		chromedp.Poll[chromedp.Void](`!document.getElementById('keys').hidden`, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.KeyEvent(kb.Escape),
		chromedp.Poll[chromedp.Void](`document.getElementById('keys').hidden`, chromedp.WithPollingTimeout(5*time.Second)),
		// / returns to the box; ↑ in the empty box recalls the last message.
		chromedp.KeyEvent("/"),
		chromedp.Poll[chromedp.Void](`document.activeElement === document.getElementById('composer')`, chromedp.WithPollingTimeout(5*time.Second)),
		// The DevTools protocol sends the "/" as a character event of its
		// own, which the page's preventDefault on keydown cannot cancel (a
		// real keyboard types nothing): clear it.
		chromedp.Poll[chromedp.Void](`(document.getElementById('composer').value = "", true)`),
		chromedp.KeyEvent(kb.ArrowUp),
		chromedp.Poll[chromedp.Void](`document.getElementById('composer').value === "two\nlines"`, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.KeyEvent(".", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.Poll[chromedp.Void](`document.getElementById('h-state').textContent === 'paused'`, chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("keys: %v", err)
	}
	if s, _ := h.st.Session(context.Background(), "default"); s.State != store.StatePaused {
		t.Fatalf("after Ctrl+.: the session is %s", s.State)
	}

	// Without the token nothing of the page renders.
	ctx2 := browserCtx(t)
	// Chromium reports the 401 as a failed load.
	if err := chromedp.Do(ctx2, chromedp.Navigate(base+"/")); err != nil && !strings.Contains(err.Error(), "ERR_HTTP_RESPONSE_CODE_FAILURE") {
		t.Fatal(err)
	}
	body, err := chromedp.Run(ctx2, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil || strings.Contains(body, "Operator input") {
		t.Errorf("the page rendered without the token: %q %v", body, err)
	}
	// It says how to get in instead of a blank page.
	if !strings.Contains(body, "klbr-core open") {
		t.Errorf("the page without the token does not say how to get in: %q", body)
	}
	if shot, err := chromedp.Run(ctx2, chromedp.FullScreenshot(100)); err == nil {
		if dir := os.Getenv("KLBR_ARTIFACTS"); dir != "" {
			os.WriteFile(filepath.Join(dir, "browser-signin.png"), shot, 0o644)
		}
	}
}
