package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// binaries builds klbr-core and klbr-kernel once per test binary.
var binaries struct {
	once sync.Once
	dir  string
	err  error
}

func buildBinaries(t *testing.T) string {
	t.Helper()
	binaries.once.Do(func() {
		binaries.dir, binaries.err = os.MkdirTemp("", "klbr-web-bin-")
		if binaries.err != nil {
			return
		}
		for _, cmd := range []string{"klbr-core", "klbr-kernel"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binaries.dir, cmd), "../../cmd/"+cmd).CombinedOutput()
			if err != nil {
				binaries.err = fmt.Errorf("go build %s: %v\n%s", cmd, err, out)
				return
			}
		}
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.dir
}

// core is a real klbr-core whose agent route is a scripted fake model.
type core struct {
	url   string // http://127.0.0.1:PORT
	token string
	ctl   *localclient.Client
	log   *syncBuffer
	data  string // the data directory
}

func startCore(t *testing.T, model *modeltest.Server) *core {
	t.Helper()
	return startCoreConf(t, fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 60\n", model.URL()))
}

// startCoreConf starts a real klbr-core with klbr.toml's text.
func startCoreConf(t *testing.T, toml string) *core {
	t.Helper()
	return startCoreEnv(t, toml)
}

// startCoreEnv is startCoreConf with more environment (NAME=value).
func startCoreEnv(t *testing.T, toml string, env ...string) *core {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		citest.SkipOrFail(t, "python3 is missing; klbr-core's workbench needs it")
	}
	bin := buildBinaries(t)
	root, err := os.MkdirTemp("", "klbr-web-e2e-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	data := filepath.Join(root, "data")
	if _, err := setup.Init(t.Context(), data); err != nil {
		t.Fatal(err)
	}
	token, err := setup.ReadToken(setup.TokenFile(data))
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(data, "klbr.toml")
	if err := os.WriteFile(conf, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	args := []string{filepath.Join(bin, "klbr-core"), "serve"}
	// As the daemon's tests do: where this user could place workers in
	// cgroups, hide the cgroup file system in a mount namespace of its own,
	// so daemons of concurrent test packages do not take each other's.
	if _, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 {
		args = append([]string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
			`mount -t tmpfs klbr-test /sys/fs/cgroup && exec "$0" "$@"`}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"KLBR_DATA_DIR=" + data, "KLBR_WORKSPACE=" + root, "KLBR_BIND_ADDR=" + addr, "KLBR_CONFIG=" + conf}
	cmd.Env = append(cmd.Env, env...)
	c := &core{url: "http://" + addr, token: token, log: &syncBuffer{}, data: data}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("klbr-core log:\n%s", c.log.String())
		}
	})
	c.ctl = localclient.New(filepath.Join(data, "control.sock"))
	t.Cleanup(c.ctl.Close)
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(c.url + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("klbr-core exited:\n%s", c.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("klbr-core did not answer /healthz:\n%s", c.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// records reads the session's durable records over the operator API.
func (c *core) records(t *testing.T) []store.Record {
	t.Helper()
	var out []store.Record
	var since int64
	for {
		page, err := c.ctl.Records(t.Context(), "default", since, 1000)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Records...)
		if !page.More || len(page.Records) == 0 {
			return out
		}
		since = page.Records[len(page.Records)-1].Seq
	}
}

func (c *core) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var b bytes.Buffer
			for _, r := range c.records(t) {
				fmt.Fprintf(&b, "%d %s %s %s\n", r.Seq, r.Lane, r.Kind, r.Content)
			}
			t.Fatalf("timed out waiting: %s\nrecords:\n%s", what, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pageRecords is what the page shows: each record element's event id and
// lane, in order, with previews apart.
const pageRecords = `[...document.querySelectorAll('.lane .record')].filter(e => e.dataset.id).map(e => e.closest('.lane').dataset.lane + ':' + e.dataset.id)`

// The operator's path through a real klbr-core with a scripted model: a
// message, then the agent's scratchpad, two cells and one delivered message,
// each in its lane; a reload in the middle of a generation shows each
// completed record exactly once, and the step that was streaming completes
// in place of its preview; Pause during a long cell interrupts it and shows
// the pause.
func TestBrowserAgentEndToEnd(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	release := make(chan struct{})
	model.Then(
		modeltest.Reply{Text: "The operator wants the answer. Let me compute it first.", Reasoning: "Six sevens.",
			Calls: []modeltest.Call{{ID: "c1", Code: "x = 6 * 7\nx"}}},
		modeltest.Reply{Text: "Now I tell them, then wait.", Calls: []modeltest.Call{{ID: "c2",
			Code: "r = await local.send(f'The answer is {x}.')\nprint(r['status'])\nawait runtime.wait(None, reason='the operator may follow up')"}}},
		// The next generation holds after a few words, until release.
		modeltest.Reply{Text: "A long job, then. I will start it and report when it is done, however long it takes.",
			Calls: []modeltest.Call{{ID: "l1", Code: "import time\nprint('working', flush=True)\ntime.sleep(120)"}},
			Hold:  release, HoldAfter: 4},
	)
	c := startCore(t, model)
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?view=lanes&token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
		chromedp.Click(chromedp.CSS(`#composer`)),
		chromedp.SendKeys(chromedp.CSS(`#composer`), "what is six times seven?"+kb.Enter),
	)
	if err != nil {
		t.Fatal(err)
	}
	// The agent thinks, runs two cells, speaks once and waits.
	if err := poll(ctx, `document.querySelector('#h-state').textContent === 'waiting' &&
		document.querySelectorAll('#lane-cell .record .outcome.yielded').length === 1`); err != nil {
		t.Fatalf("the first exchange: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#lanes').innerText`))
	}
	lanes := eval[map[string]float64](t, ctx, `Object.fromEntries([...document.querySelectorAll('.lane')].map(l => [l.dataset.lane, l.querySelectorAll('.record').length]))`)
	if lanes["input"] != 1 || lanes["scratchpad"] != 2 || lanes["cell"] != 2 || lanes["speech"] != 1 {
		t.Errorf("lanes after the first exchange: %v, want 1 input, 2 scratchpad, 2 cells, 1 speech", lanes)
	}
	text := func(sel string) string {
		return eval[string](t, ctx, `document.querySelector(`+"`"+sel+"`"+`).innerText`)
	}
	for _, c := range []struct{ sel, want string }{
		{"#lane-input .items", "what is six times seven?"},
		{"#lane-scratchpad .items", "Let me compute it first."},
		{"#lane-scratchpad .items", "Now I tell them, then wait."},
		{"#lane-cell .items", "x = 6 * 7"},
		{"#lane-cell .items", "42"},
		{"#lane-speech .items", "The answer is 42."},
		{"#lane-notice .items", "waiting until input: the operator may follow up"},
		{"#h-wait", "until input"},
		{"#h-agent", "route main (fake)"},
	} {
		if got := text(c.sel); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q does not contain %q", c.sel, got, c.want)
		}
	}
	if s := text("#lane-speech .items"); strings.Contains(s, "compute it first") {
		t.Errorf("scratchpad in the speech lane: %q", s)
	}
	screenshot(t, ctx, "agent-e2e-1-exchange")

	// A generation streams and holds: the page shows its provisional preview.
	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#composer`)),
		chromedp.SendKeys(chromedp.CSS(`#composer`), "run the long job"+kb.Enter),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `(() => { const p = document.querySelector('#lane-scratchpad .record.preview');
		return p !== null && p.innerText.includes('A long job') && p.innerText.includes('provisional'); })()`); err != nil {
		t.Fatalf("no live preview of the held generation: %v\n%s", err, text("#lane-scratchpad .items"))
	}
	screenshot(t, ctx, "agent-e2e-2-streaming")

	// Reload in the middle of the generation: each completed record once.
	if err := chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`))); err != nil {
		t.Fatal(err)
	}
	durable := c.records(t)
	if err := poll(ctx, fmt.Sprintf(`%s.length >= %d`, pageRecords, elements(durable))); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	checkOnce(t, eval[[]string](t, ctx, pageRecords), c.records(t))
	screenshot(t, ctx, "agent-e2e-3-reloaded")

	// The generation completes: its record arrives once, with no preview
	// left, and the long cell starts.
	close(release)
	if err := poll(ctx, `document.querySelector('#lane-scratchpad .record.preview') === null &&
		[...document.querySelectorAll('#lane-scratchpad .record')].some(r => r.innerText.includes('however long it takes')) &&
		document.querySelector('#lane-cell .outcome.running') !== null`); err != nil {
		t.Fatalf("the held step did not complete into its record: %v\n%s", err, text("#lanes"))
	}
	checkOnce(t, eval[[]string](t, ctx, pageRecords), c.records(t))

	// Pause (Ctrl+.) during the long cell: the cell is interrupted and the
	// page shows the pause.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#btn-session-pause`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#h-state').textContent === 'paused' &&
		[...document.querySelectorAll('#lane-notice .record')].some(r => r.innerText.includes('paused by the operator')) &&
		document.querySelector('#lane-cell .outcome.running') === null`); err != nil {
		t.Fatalf("the pause: %v\n%s", err, text("#lanes"))
	}
	c.eventually(t, "the long cell is recorded as cancelled", func() bool {
		for _, r := range c.records(t) {
			if r.Kind == "cell.finished" && strings.Contains(string(r.Content), `"status":"cancelled"`) {
				return true
			}
		}
		return false
	})
	if err := poll(ctx, `document.querySelectorAll('#lane-cell .record .outcome.cancelled').length === 1`); err != nil {
		t.Fatalf("the cancelled cell: %v\n%s", err, text("#lane-cell .items"))
	}
	if got := text("#h-reason"); !strings.Contains(got, "paused by the operator") {
		t.Errorf("header reason %q", got)
	}
	time.Sleep(200 * time.Millisecond)
	checkOnce(t, eval[[]string](t, ctx, pageRecords), c.records(t))
	screenshot(t, ctx, "agent-e2e-4-paused")
	if n := model.Count(); n != 3 {
		t.Errorf("%d model requests, want 3 (none after the pause)", n)
	}
}

// elements is how many record elements the page shows for recs: a
// cell.finished joins its cell.started.
func elements(recs []store.Record) int {
	n := 0
	for _, r := range recs {
		if r.Kind != "cell.finished" {
			n++
		}
	}
	return n
}

// checkOnce compares the page's records with the durable ones: every
// record shown once, in its lane; a cell.finished joins its cell.started.
func checkOnce(t *testing.T, page []string, durable []store.Record) {
	t.Helper()
	shown := map[string]int{}
	for _, p := range page {
		shown[p]++
	}
	for p, n := range shown {
		if n != 1 {
			t.Errorf("record %s shown %d times", p, n)
		}
	}
	for _, r := range durable {
		if r.Kind == "cell.finished" {
			continue // joined into its cell.started
		}
		key := fmt.Sprintf("%s:%d", r.Lane, r.ID)
		if shown[key] != 1 {
			t.Errorf("durable record %d (%s %s) shown %d times in its lane", r.ID, r.Lane, r.Kind, shown[key])
		}
	}
}

// A compaction in the page: a collapsible summary block in the notice lane
// with its range, the summary's text and how to read the originals.
func TestBrowserShowsCompaction(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var n atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		i := n.Add(1)
		if i%2 == 1 {
			return modeltest.Reply{Text: "working", Calls: []modeltest.Call{{ID: fmt.Sprintf("p%d", i), Code: "print('w' * 3000)"}}}
		}
		return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", i), Code: "await runtime.wait(None)"}}}
	})
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "The operator asked twice; the agent printed w each time."}
	})
	c := startCore(t, model)
	for i := range 2 {
		if _, err := c.ctl.Send(t.Context(), "default", api.SendRequest{Text: fmt.Sprintf("round %d", i), SourceKey: fmt.Sprintf("r%d", i)}); err != nil {
			t.Fatal(err)
		}
		c.eventually(t, "the round's wait", func() bool { return int(n.Load()) >= 2*(i+1) })
		c.eventually(t, "waiting", func() bool {
			s, err := c.ctl.Session(t.Context(), "default")
			return err == nil && s.State == store.StateWaiting
		})
	}
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// The page's Compact control runs klbr-core compact's path.
	if err := chromedp.Do(ctx, chromedp.Navigate(c.url+"/?view=lanes&token="+c.token), chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
		chromedp.Click(chromedp.CSS(`#btn-compact`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#lane-notice details.summary-block') !== null`); err != nil {
		t.Fatalf("no summary block: %v", err)
	}
	var out struct {
		Summary       string
		Before, After int
	}
	for _, r := range c.records(t) {
		if r.Kind == "context.compacted" {
			var n struct {
				Summary string `json:"summary"`
				Before  int    `json:"tokens_before"`
				After   int    `json:"tokens_after"`
			}
			_ = json.Unmarshal(r.Content, &n)
			out.Summary, out.Before, out.After = n.Summary, n.Before, n.After
		}
	}
	head := eval[string](t, ctx, `document.querySelector('#lane-notice details.summary-block summary').innerText`)
	if !strings.Contains(head, "context compacted: "+out.Summary+" (normal)") || !strings.Contains(head, "records") {
		t.Fatalf("summary line %q", head)
	}
	// The one measure, worded as klbr-core compact and tail word it.
	if want := history.Measure(out.Before, out.After); !strings.Contains(head, want) {
		t.Fatalf("summary line %q lacks %q", head, want)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#lane-notice details.summary-block summary`))); err != nil {
		t.Fatal(err)
	}
	body := eval[string](t, ctx, `document.querySelector('#lane-notice details.summary-block').innerText`)
	if !strings.Contains(body, "the agent printed w each time") || !strings.Contains(body, "klbr-core history children "+out.Summary) {
		t.Fatalf("summary block %q", body)
	}
	screenshot(t, ctx, "agent-e2e-compaction")
}
