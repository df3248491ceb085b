package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// fakeBench records resets; reset, when set, answers them.
type fakeBench struct {
	mu     sync.Mutex
	resets [][2]string
	reset  func(session, reason string) error
}

func (f *fakeBench) Reset(_ context.Context, session, reason string) error {
	f.mu.Lock()
	f.resets = append(f.resets, [2]string{session, reason})
	fn := f.reset
	f.mu.Unlock()
	if fn != nil {
		return fn(session, reason)
	}
	return nil
}

// ctlHarness is the harness with every control wired to real parts: the
// store, the releases directory and the activation service (prompt-only
// activations and corrupt candidates need no hook worker), plus a fake
// workbench and a real artifact store.
type ctlHarness struct {
	*harness
	bench    *fakeBench
	rel      *behavior.Releases
	svc      *activation.Service
	arts     *artifacts.Store
	initial  string // the release active at epoch 1
	soulText string
}

func startControls(t *testing.T) *ctlHarness {
	t.Helper()
	dir := t.TempDir()
	c := &ctlHarness{bench: &fakeBench{}, soulText: "You are kind.\n"}
	var err error
	if c.rel, err = behavior.Open(filepath.Join(dir, "releases")); err != nil {
		t.Fatal(err)
	}
	if c.arts, err = artifacts.New(filepath.Join(dir, "artifacts")); err != nil {
		t.Fatal(err)
	}
	c.harness = startWith(t, func(h *harness, b *Browser) {
		c.svc = activation.New(h.st, c.rel, hooks.New(hooks.Config{}), nil, nil)
		b.Workbench, b.Behavior, b.Releases, b.Artifacts = c.bench, c.svc, c.rel, c.arts
	})
	// The initial release, activated as boot would (without its check).
	c.initial = c.publish(t, map[string]string{
		"soul.md": c.soulText, "instructions.md": "Be brief.\n", "klbr_hooks/__init__.py": "# hooks\n",
	})
	if err := c.st.Write(context.Background(), func(tx *store.Tx) error {
		_, err := tx.Activate("default", 0, c.initial, "initial", "test boot")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// publish stores a tree of files as a release and records it.
func (c *ctlHarness) publish(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := c.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.svc.Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m.ID
}

// ctlMsg is a server message with the controls' fields.
type ctlMsg struct {
	Type    string            `json:"type"`
	Action  string            `json:"action"`
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Session string            `json:"session"`
	State   *store.Session    `json:"state"`
	Result  activation.Result `json:"result"`
}

// answer reads until a message that is not records (the controls' own
// notices arrive as records meanwhile).
func answer(t *testing.T, c *websocket.Conn) ctlMsg {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, b, err := c.Read(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var m ctlMsg
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type != MsgRecords {
			return m
		}
	}
	t.Fatal("no answer")
	return ctlMsg{}
}

func epochOf(t *testing.T, h *harness) (int64, string) {
	t.Helper()
	s, err := h.st.Session(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	return s.BehaviorEpoch, s.PolicyRevision
}

func (h *harness) get(t *testing.T, path string, authed bool) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.http.URL+path, nil)
	if authed {
		req.Header.Set("Cookie", CookieName+"="+testToken)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

func soulOf(t *testing.T, h *harness) soulMsg {
	t.Helper()
	res := h.get(t, "/v2/soul?session=default", true)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v2/soul: %s", res.Status)
	}
	var s soulMsg
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestControlEditSoulActivateRollback(t *testing.T) {
	c := startControls(t)
	s := soulOf(t, c.harness)
	if s.Text != c.soulText || !s.Exists || s.Epoch != 1 || s.Release != c.initial {
		t.Fatalf("soul before: %+v", s)
	}
	ws := c.hello(t, 0)

	// The soul edit is a prompt-only activation of a new release.
	writeJSON(t, ws, map[string]any{"type": "edit_soul", "text": "You are curious.\n", "expected_epoch": 1})
	m := answer(t, ws)
	if m.Type != MsgActivated || m.Action != MsgEditSoul || m.Result.Kind != behavior.KindPrompt || m.Result.Epoch != 2 {
		t.Fatalf("edit_soul answer: %+v", m)
	}
	edited := m.Result.Release
	if edited == c.initial {
		t.Fatal("the soul edit did not make a new release")
	}
	if s := soulOf(t, c.harness); s.Text != "You are curious.\n" || s.Epoch != 2 || s.Release != edited {
		t.Fatalf("soul after: %+v", s)
	}
	// The other documents came along unchanged.
	if b, err := os.ReadFile(filepath.Join(c.rel.Tree(edited), "instructions.md")); err != nil || string(b) != "Be brief.\n" {
		t.Fatalf("instructions.md in the edited release: %q %v", b, err)
	}

	// A stale epoch changes nothing.
	writeJSON(t, ws, map[string]any{"type": "edit_soul", "text": "stale\n", "expected_epoch": 1})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeConflict || m.Action != MsgEditSoul {
		t.Fatalf("stale edit_soul: %+v", m)
	}
	if e, r := epochOf(t, c.harness); e != 2 || r != edited {
		t.Fatalf("after a stale edit: epoch %d release %s", e, r)
	}

	// Rollback returns to the initial release.
	writeJSON(t, ws, map[string]any{"type": "rollback"})
	m = answer(t, ws)
	if m.Type != MsgActivated || m.Action != MsgRollback || m.Result.Release != c.initial || m.Result.Epoch != 3 {
		t.Fatalf("rollback answer: %+v", m)
	}

	// Activate by id prefix, against the current epoch; a stale one is refused.
	writeJSON(t, ws, map[string]any{"type": "activate", "release": edited[:16], "expected_epoch": 2})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeConflict || m.Action != MsgActivate {
		t.Fatalf("stale activate: %+v", m)
	}
	writeJSON(t, ws, map[string]any{"type": "activate", "release": edited[:16], "expected_epoch": 3})
	m = answer(t, ws)
	if m.Type != MsgActivated || m.Action != MsgActivate || m.Result.Release != edited || m.Result.Epoch != 4 || m.Result.Kind != behavior.KindPrompt {
		t.Fatalf("activate answer: %+v", m)
	}
	writeJSON(t, ws, map[string]any{"type": "activate", "release": "ffffffffffff", "expected_epoch": 4})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeInvalid {
		t.Fatalf("activate of an unknown release: %+v", m)
	}
	if e, r := epochOf(t, c.harness); e != 4 || r != edited {
		t.Fatalf("at the end: epoch %d release %s", e, r)
	}
}

func TestControlRefusedCandidate(t *testing.T) {
	c := startControls(t)
	bad := c.publish(t, map[string]string{"soul.md": "other\n", "instructions.md": "Be brief.\n"})
	// Corrupt the stored release: its check refuses it before any worker runs.
	p := filepath.Join(c.rel.Tree(bad), "soul.md")
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, []byte("tampered\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := c.hello(t, 0)
	writeJSON(t, ws, map[string]any{"type": "activate", "release": bad, "expected_epoch": 1})
	m := answer(t, ws)
	if m.Type != MsgError || m.Code != api.CodeRefused || m.Action != MsgActivate || !strings.Contains(m.Message, "refused") {
		t.Fatalf("corrupt candidate: %+v", m)
	}
	if e, r := epochOf(t, c.harness); e != 1 || r != c.initial {
		t.Fatalf("a refused candidate changed the session: epoch %d release %s", e, r)
	}
}

func TestControlResetAndSession(t *testing.T) {
	c := startControls(t)
	ws := c.hello(t, 0)

	// A reset starts a new context epoch; the workbench stays.
	writeJSON(t, ws, map[string]any{"type": "reset"})
	if m := answer(t, ws); m.Type != MsgAck || m.Action != MsgReset || m.Session != "default" || !strings.Contains(m.Message, "epoch 1 starts empty") {
		t.Fatalf("reset: %+v", m)
	}
	if s, _ := c.st.Session(context.Background(), "default"); s.ContextEpoch != 1 {
		t.Fatalf("context epoch %d after a reset, want 1", s.ContextEpoch)
	}
	c.bench.mu.Lock()
	if len(c.bench.resets) != 0 {
		t.Fatalf("a context reset reset the workbench: %v", c.bench.resets)
	}
	c.bench.mu.Unlock()
	// With kernel, the workbench too.
	writeJSON(t, ws, map[string]any{"type": "reset", "kernel": true})
	if m := answer(t, ws); m.Type != MsgAck || !strings.Contains(m.Message, "epoch 2") || !strings.Contains(m.Message, "workbench was reset") {
		t.Fatalf("reset with kernel: %+v", m)
	}
	c.bench.mu.Lock()
	got := c.bench.resets
	c.bench.reset = func(string, string) error { return workbench.ErrClosed }
	c.bench.mu.Unlock()
	if len(got) != 1 || got[0] != [2]string{"default", "reset from the browser"} {
		t.Fatalf("resets: %v", got)
	}
	writeJSON(t, ws, map[string]any{"type": "reset", "session": "default", "kernel": true})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeDraining || m.Action != MsgReset {
		t.Fatalf("reset of a closed workbench: %+v", m)
	}
	writeJSON(t, ws, map[string]any{"type": "reset", "session": "nope"})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeNotFound {
		t.Fatalf("reset of an unknown session: %+v", m)
	}

	for _, step := range []struct {
		typ  string
		want store.SessionState
	}{
		{"session_stop", store.StateStopped},
		{"session_start", store.StateReady},
		{"session_pause", store.StatePaused},
		{"session_start", store.StateReady},
		{"session_drain", store.StateStopped},
		{"session_start", store.StateReady},
	} {
		writeJSON(t, ws, map[string]any{"type": step.typ})
		m := answer(t, ws)
		if m.Type != MsgAck || m.Action != step.typ || m.State == nil || m.State.State != step.want {
			t.Fatalf("%s: %+v", step.typ, m)
		}
		s, _ := c.st.Session(context.Background(), "default")
		if s.State != step.want {
			t.Fatalf("%s: the store says %s", step.typ, s.State)
		}
	}
	writeJSON(t, ws, map[string]any{"type": "session_start"})
	if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeConflict {
		t.Fatalf("start of a ready session: %+v", m)
	}
}

func TestControlsUnavailable(t *testing.T) {
	h := start(t) // no workbench, behavior, releases or artifacts
	ws := h.hello(t, 0)
	for _, msg := range []map[string]any{
		{"type": "reset", "kernel": true},
		{"type": "rollback"},
		{"type": "activate", "release": "abc", "expected_epoch": 0},
		{"type": "edit_soul", "text": "x", "expected_epoch": 0},
	} {
		writeJSON(t, ws, msg)
		if m := answer(t, ws); m.Type != MsgError || m.Code != api.CodeUnavailable || m.Action != msg["type"] {
			t.Fatalf("%v: %+v", msg, m)
		}
	}
	if res := h.get(t, "/v2/soul", true); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/v2/soul without releases: %s", res.Status)
	}
	if res := h.get(t, "/v2/artifacts/"+strings.Repeat("a", 64), true); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/v2/artifacts without a store: %s", res.Status)
	}
}

func TestControlMessagesDecode(t *testing.T) {
	good := []string{
		`{"type":"reset"}`, `{"type":"reset","session":"s-1"}`, `{"type":"reset","kernel":true}`,
		`{"type":"session_drain"}`, `{"type":"session_stop"}`, `{"type":"session_pause"}`, `{"type":"session_start"}`, `{"type":"rollback"}`,
		`{"type":"activate","release":"abc","expected_epoch":0}`,
		`{"type":"edit_soul","text":"x","expected_epoch":3}`,
		`{"type":"job_cancel","job":4}`,
		`{"type":"spend_cap","cap":"daily","usd":5}`, `{"type":"spend_cap","cap":"monthly","usd":0.01}`,
	}
	for _, s := range good {
		if _, err := DecodeClientMessage([]byte(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	bad := []string{
		`{"type":"reset","session":"../x"}`, `{"type":"reset","text":"x"}`,
		`{"type":"session_stop","session":"default"}`, `{"type":"session_stop","kernel":true}`, `{"type":"session_pause","reason":"x"}`, `{"type":"rollback","expected_epoch":1}`,
		`{"type":"activate","release":"abc"}`, `{"type":"activate","expected_epoch":1}`,
		`{"type":"activate","release":"abc","expected_epoch":-1}`, `{"type":"activate","release":"abc","expected_epoch":1,"text":"x"}`,
		`{"type":"edit_soul","expected_epoch":1}`, `{"type":"edit_soul","text":"x"}`,
		`{"type":"edit_soul","text":"x","expected_epoch":1,"release":"abc"}`,
		`{"type":"hello","session":"default","expected_epoch":1}`, `{"type":"send","text":"x","key":"k","release":"r"}`,
		`{"type":"drain","expected_epoch":0}`,
		`{"type":"job_cancel"}`, `{"type":"job_cancel","job":0}`, `{"type":"job_cancel","job":-1}`, `{"type":"job_cancel","job":"4"}`,
		`{"type":"job_cancel","job":4,"session":"default"}`,
		`{"type":"spend_cap","cap":"weekly","usd":5}`, `{"type":"spend_cap","usd":5}`, `{"type":"spend_cap","cap":"daily"}`,
		`{"type":"spend_cap","cap":"daily","usd":0}`, `{"type":"spend_cap","cap":"daily","usd":-1}`, `{"type":"spend_cap","cap":"daily","usd":1e7}`,
		`{"type":"spend_cap","cap":"daily","usd":"5"}`, `{"type":"spend_cap","cap":"daily","usd":5,"session":"default"}`,
	}
	for _, s := range bad {
		if _, err := DecodeClientMessage([]byte(s)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: want a bad message, got %v", s, err)
		}
	}
}

func TestSoulAndArtifactsNeedToken(t *testing.T) {
	c := startControls(t)
	for _, p := range []string{"/v2/soul", "/v2/soul?session=default", "/v2/artifacts/" + strings.Repeat("0", 64), "/v2/artifacts/nothex"} {
		res := c.get(t, p, false)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusUnauthorized || len(body) != 0 {
			t.Errorf("%s without the token: %s, %d bytes", p, res.Status, len(body))
		}
	}
	req, _ := http.NewRequest(http.MethodGet, c.http.URL+"/v2/soul", nil)
	req.Header.Set("Authorization", "Bearer wrong-token")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("/v2/soul with a wrong token: %s", res.Status)
	}
}

func TestArtifactServed(t *testing.T) {
	c := startControls(t)
	sp, err := c.arts.NewSpool()
	if err != nil {
		t.Fatal(err)
	}
	content := "line 1\n<script>alert(1)</script>\n" + strings.Repeat("x", 5000) + "\n"
	sp.Write([]byte(content))
	ref, err := sp.Commit()
	if err != nil {
		t.Fatal(err)
	}
	res := c.get(t, "/v2/artifacts/"+ref.SHA256, true)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(body) != content {
		t.Fatalf("artifact: %s, %d bytes", res.Status, len(body))
	}
	for k, v := range map[string]string{
		"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
	} {
		if got := res.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	for p, want := range map[string]int{
		"/v2/artifacts/" + strings.Repeat("0", 64):              http.StatusNotFound,
		"/v2/artifacts/" + strings.ToUpper(ref.SHA256):          http.StatusBadRequest,
		"/v2/artifacts/" + ref.SHA256[:63]:                      http.StatusBadRequest,
		"/v2/artifacts/nothex":                                  http.StatusBadRequest,
		"/v2/artifacts/..%2f..%2fetc%2fpasswd":                  http.StatusBadRequest,
		"/v2/artifacts/" + ref.SHA256 + "%2f..%2f" + ref.SHA256: http.StatusBadRequest,
	} {
		if res := c.get(t, p, true); res.StatusCode != want {
			t.Errorf("%s: %s, want %d", p, res.Status, want)
		}
	}
}

// TestBrowserControls drives the controls panel in headless Chromium: the
// soul editor publishes a prompt-only activation, reset reaches the
// workbench, and a cell's artifact link opens the full output.
func TestBrowserControls(t *testing.T) {
	c := startControls(t)
	sp, err := c.arts.NewSpool()
	if err != nil {
		t.Fatal(err)
	}
	full := strings.Repeat("the full output\n", 300)
	sp.Write([]byte(full))
	ref, err := sp.Commit()
	if err != nil {
		t.Fatal(err)
	}
	err = c.st.Write(context.Background(), func(tx *store.Tx) error {
		gen, err := tx.NextKernelGeneration("default", nil)
		if err != nil {
			return err
		}
		id, _, err := tx.StartExecution("default", gen, "print('x' * 10**6)", nil)
		if err != nil {
			return err
		}
		outcome, _ := json.Marshal(map[string]any{"status": "ok", "generation": gen,
			"output": map[string]any{"preview": []map[string]string{{"stream": "stdout", "origin": "execution", "data": "the full output\n"}},
				"omitted_bytes": len(full) - 16, "artifact": ref}})
		return tx.FinishExecution("default", id, "ok", false, outcome)
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := browserCtx(t)
	type css = chromedp.CSS
	err = chromedp.Do(ctx,
		chromedp.Navigate(c.http.URL+"/?view=lanes&token="+testToken),
		chromedp.WaitVisible(css(`#h-conn[data-state="live"]`)),
		chromedp.WaitVisible(css(`#lane-cell .artifact a`)),
	)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)); err != nil {
		t.Fatal(err)
	}
	// The artifact link opens the full output.
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		const a = document.querySelector('#lane-cell .artifact a');
		const x = new XMLHttpRequest(); x.open('GET', a.href, false); x.send();
		return a.getAttribute('href') + '|' + x.status + '|' + x.responseText; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "/v2/artifacts/" + ref.SHA256 + "|200|" + full; got != want {
		t.Errorf("artifact link: %.120q", got)
	}

	// The soul editor loads the active soul; publishing activates a new release.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#soul summary`)),
		chromedp.Poll[chromedp.Void](`document.getElementById('soul-text').value === "You are kind.\n"`, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.SetValue(css(`#soul-text`), "You are kind and exact.\n"),
		chromedp.Click(css(`#btn-soul-save`)),
		chromedp.Poll[chromedp.Void](`document.getElementById('controls-status').textContent.startsWith("edit_soul: epoch 2, prompt")`,
			chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Poll[chromedp.Void](`document.getElementById('soul-meta').textContent.startsWith("loaded at epoch 2")`,
			chromedp.WithPollingTimeout(5*time.Second)),
	)
	if err != nil {
		st, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('controls-status').textContent`))
		t.Fatalf("soul edit: %v (status %q)", err, st)
	}
	if s := soulOf(t, c.harness); s.Epoch != 2 || s.Text != "You are kind and exact.\n" {
		t.Fatalf("after the browser's soul edit: %+v", s)
	}
	// Context · Reset starts a new context epoch; Kernel · Reset also
	// reaches the workbench.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#btn-reset-context`)),
		chromedp.Poll[chromedp.Void](`document.getElementById('controls-status').textContent.startsWith("reset: the context was reset: epoch 1")`,
			chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#lane-notice .record')].some(r => r.innerText.includes("context reset: epoch 1 starts empty"))`,
			chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Click(css(`#btn-reset`)),
		chromedp.Poll[chromedp.Void](`document.getElementById('controls-status').textContent.includes("the workbench was reset")`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	c.bench.mu.Lock()
	n := len(c.bench.resets)
	c.bench.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d workbench resets, want 1", n)
	}
	if shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		if dir := os.Getenv("KLBR_ARTIFACTS"); dir != "" {
			os.WriteFile(filepath.Join(dir, "browser-controls.png"), shot, 0o644)
		}
	}
}
