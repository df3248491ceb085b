package nix_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// The dashboard may only query what klbr-core exposes. "Exposes" is decided
// against the real thing: the klbr-core binary built from this tree, started
// on a fresh data directory and scraped. A few metric families only have
// samples after events a test cannot cause from outside yet (hook
// invocations: no cell can reach a hook before local.send is served); for
// those the daemon's own registry (internal/metrics, the code the binary
// runs) is driven in-process through the same calls the daemon makes.

var daemonBuild struct {
	sync.Once
	dir string
	err error
}

// daemonBinaries builds klbr-core and klbr-kernel (klbr-core finds the
// kernel beside itself) once per test run and returns klbr-core's path.
func daemonBinaries(t *testing.T) string {
	t.Helper()
	daemonBuild.Do(func() {
		dir, err := os.MkdirTemp("", "klbr-nix-bin-")
		if err != nil {
			daemonBuild.err = err
			return
		}
		daemonBuild.dir = dir
		root := repoRoot(t)
		for _, cmd := range []string{"klbr-core", "klbr-kernel"} {
			c := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
			c.Dir = root
			c.Env = append(os.Environ(), "CGO_ENABLED=1")
			if out, err := c.CombinedOutput(); err != nil {
				daemonBuild.err = fmt.Errorf("go build ./cmd/%s: %v\n%s", cmd, err, out)
				return
			}
		}
	})
	if daemonBuild.err != nil {
		t.Fatal(daemonBuild.err)
	}
	return filepath.Join(daemonBuild.dir, "klbr-core")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if daemonBuild.dir != "" {
		os.RemoveAll(daemonBuild.dir)
	}
	os.Exit(code)
}

// liveDaemon is a klbr-core serve process on a temporary data directory.
type liveDaemon struct {
	bin, data string
	env       []string
	url       string
	cmd       *exec.Cmd
	exited    chan error
	mu        sync.Mutex
	stderr    bytes.Buffer
}

var servingURL = regexp.MustCompile(`open (http://127\.0\.0\.1:\d+)/`)

func newDaemon(t *testing.T) *liveDaemon {
	t.Helper()
	bin := daemonBinaries(t)
	dir, err := os.MkdirTemp("", "klbr-nix-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &liveDaemon{bin: bin, data: filepath.Join(dir, "data"), exited: make(chan error, 1)}
	d.env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "KLBR_DATA_DIR=" + d.data,
		"KLBR_BIND_ADDR=127.0.0.1:0", "KLBR_WORKSPACE=" + dir,
	}
	d.run(t, nil, "init")
	return d
}

// run runs one klbr-core command to completion with extra environment.
func (d *liveDaemon) run(t *testing.T, env []string, args ...string) string {
	t.Helper()
	c := exec.Command(d.bin, args...)
	c.Env = append(append([]string{}, d.env...), env...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("klbr-core %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

func (d *liveDaemon) serve(t *testing.T) {
	t.Helper()
	d.cmd = exec.Command(d.bin, "serve")
	d.cmd.Env = d.env
	pr, pw := io.Pipe()
	d.cmd.Stderr = pw
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			d.mu.Lock()
			d.stderr.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			if m := servingURL.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case urls <- m[1]:
				default:
				}
			}
		}
	}()
	go func() { err := d.cmd.Wait(); pw.Close(); d.exited <- err }()
	t.Cleanup(func() { d.cmd.Process.Kill() })
	select {
	case d.url = <-urls:
	case err := <-d.exited:
		t.Fatalf("klbr-core serve exited: %v\n%s", err, d.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("klbr-core serve did not say where it serves within 60 s\n%s", d.log())
	}
}

func (d *liveDaemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

// stop sends SIGTERM (systemctl stop) and waits for the drain to end.
func (d *liveDaemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			t.Errorf("klbr-core serve after SIGTERM: %v\n%s", err, d.log())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("klbr-core serve did not exit within 30 s of SIGTERM\n%s", d.log())
	}
}

func get200(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return body
}

// sampleNames are the names of the samples in a Prometheus text exposition
// (histograms contribute their _bucket, _sum and _count).
func sampleNames(exposition []byte) map[string]bool {
	names := map[string]bool{}
	for line := range strings.SplitSeq(string(exposition), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// promtoolCheck runs `promtool check metrics` on an exposition.
func promtoolCheck(t *testing.T, what string, exposition []byte) {
	t.Helper()
	promtool := requireTool(t, "promtool", "prometheus")
	c := exec.Command(promtool, "check", "metrics")
	c.Stdin = bytes.NewReader(exposition)
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s: %v\n%s", what, err, out)
	}
}

// liveScrape starts the real daemon with one pending input and one held
// review in its store, checks /healthz and the operator CLI as the NixOS
// module sets it up (KLBR_CONTROL_SOCKET only), and returns /metrics.
func liveScrape(t *testing.T) []byte {
	t.Helper()
	d := newDaemon(t)

	// A delivery.review that held, recorded as the hook dispatcher records
	// it: klbr_delivery_reviews_held_total is read from the store.
	st, err := store.Open(context.Background(), d.data, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = st.Write(context.Background(), func(tx *store.Tx) error {
		return tx.RecordHookInvocation(store.HookInvocation{
			Session: "default", Slot: "delivery.review", Release: "test", InputDigest: "test",
			Outcome: "ok", Result: json.RawMessage(`{"decision":"hold"}`), Latency: time.Millisecond,
		})
	})
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	d.serve(t)
	// The operator's shell on NixOS: only KLBR_CONTROL_SOCKET, no data
	// directory of its own.
	admin := []string{"KLBR_DATA_DIR=", "HOME=" + t.TempDir(), "KLBR_CONTROL_SOCKET=" + filepath.Join(d.data, "control.sock")}
	if id := strings.TrimSpace(d.run(t, admin, "send", "default", "hi")); id == "" {
		t.Fatal("send printed no id")
	}
	if out := d.run(t, admin, "status"); !strings.Contains(out, "serving") {
		t.Errorf("klbr-core status with KLBR_CONTROL_SOCKET:\n%s", out)
	}
	if body := get200(t, d.url+"/healthz"); !bytes.Contains(body, []byte("ok")) {
		t.Errorf("/healthz: %s", body)
	}
	scrape := get200(t, d.url+"/metrics")
	d.stop(t)
	return scrape
}

// registryScrape is the daemon's metrics registry, in-process, after one
// hook invocation of each outcome the dispatcher records, with one worker
// host.
func registryScrape(t *testing.T) []byte {
	t.Helper()
	d := newDaemon(t)
	st, err := store.Open(context.Background(), d.data, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := metrics.New(st, time.Now, slog.New(slog.DiscardHandler))
	for _, outcome := range []string{"ok", "error", "invalid", "timeout", "unavailable"} {
		m.HookInvocation("delivery.review", outcome, 3*time.Millisecond)
	}
	n := 7
	m.ObserveModel("main", "ok", provider.Usage{PromptTokens: &n, CompletionTokens: &n, CacheReadTokens: &n, CacheWriteTokens: &n})
	// The spend meter's metrics, as a daemon whose agent runs exposes them.
	spent := m.WatchSpend(func() metrics.SpendState {
		return metrics.SpendState{DayUSD: 0.5, Warned: []string{"daily_usd"}, Held: 1}
	}, []string{"main"})
	spent("main", "turn", 0.01, 14)
	// A worker host, as the daemon reports [hosts.NAME] (the live daemon has none).
	m.WatchPromptCache(func() map[string]float64 { return map[string]float64{"main": 0.9} })
	m.WatchHosts(func(context.Context) []metrics.HostState {
		return []metrics.HostState{{Name: "gpu", Up: true, Units: map[string]int{"job": 1}, Waiting: 2}}
	})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	return get200(t, srv.URL)
}

type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "nix", "grafana", "klbr.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("nix/grafana/klbr.json: %v", err)
	}
	return d
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promVariable = regexp.MustCompile(`\$\{?\w+\}?`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	labelValues  = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
)

var promKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// promqlMetrics returns the metric names a PromQL expression selects.
func promqlMetrics(expr string) []string {
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		expr = m[1] // label_values(SELECTOR, label): only the selector names a metric
	}
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, "")
	s = promRange.ReplaceAllString(s, "")
	s = promGrouping.ReplaceAllString(s, "")
	s = promVariable.ReplaceAllString(s, "")
	var out []string
	for _, m := range promIdent.FindAllStringSubmatch(s, -1) {
		if m[1] != "" || promKeywords[strings.ToLower(m[0])] {
			continue // a function call or a keyword
		}
		out = append(out, m[0])
	}
	return out
}

func TestPromQLMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`klbr_build_info{instance=~"$instance"}`, []string{"klbr_build_info"}},
		{`sum by (session, source_kind) (rate(klbr_admissions_total{result=~"a|b"}[$__rate_interval]))`, []string{"klbr_admissions_total"}},
		{`histogram_quantile(0.95, sum by (slot, le) (rate(x_bucket{a="}"}[5m])))`, []string{"x_bucket"}},
		{`sum(rate(a_total[1m])) / sum(rate(b_total[1m]))`, []string{"a_total", "b_total"}},
		{`time() - process_start_time_seconds{job=~"$job"}`, []string{"process_start_time_seconds"}},
		{`klbr_placement_mode == 1 and on (instance) up`, []string{"klbr_placement_mode", "up"}},
		{`label_values(klbr_build_info{job=~"$job"}, instance)`, []string{"klbr_build_info"}},
	} {
		if got := promqlMetrics(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("promqlMetrics(%s) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestDashboardQueriesExposedMetrics fails if any panel or variable of
// nix/grafana/klbr.json queries a metric klbr-core does not expose, and
// runs promtool check metrics on what it exposes.
func TestDashboardQueriesExposedMetrics(t *testing.T) {
	live := liveScrape(t)
	promtoolCheck(t, "the live /metrics", live)
	registry := registryScrape(t)
	promtoolCheck(t, "the registry with hook invocations", registry)

	liveNames, registryNames := sampleNames(live), sampleNames(registry)
	for _, want := range []string{"klbr_build_info", "klbr_inbox_pending_inputs", "klbr_delivery_reviews_held_total",
		"klbr_session_blocked", "klbr_storage_bytes", "klbr_attention_oldest_unanswered_age_seconds", "klbr_outbox_effects"} {
		if !liveNames[want] {
			t.Errorf("the live daemon exposes no %s; the test's setup no longer produces it", want)
		}
	}

	d := readDashboard(t)
	if d.UID == "" {
		t.Error("the dashboard has no uid (provisioning keys dashboards by it)")
	}
	queried := map[string][]string{} // metric -> where
	ids := map[int]string{}
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			switch p.Type {
			case "row":
				walk(p.Panels)
				continue
			case "text":
				if len(p.Targets) != 0 {
					t.Errorf("text panel %q has queries", p.Title)
				}
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q does not use the ${datasource} variable: %+v", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				names := promqlMetrics(tg.Expr)
				if len(names) == 0 {
					t.Errorf("panel %q query %s selects no metric: %q", p.Title, tg.RefID, tg.Expr)
				}
				for _, n := range names {
					queried[n] = append(queried[n], fmt.Sprintf("panel %q", p.Title))
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				t.Errorf("variable %s: query %s", v.Name, v.Query)
			}
			q.Query = s
		}
		for _, n := range promqlMetrics(q.Query) {
			queried[n] = append(queried[n], "variable $"+v.Name)
		}
	}

	if len(queried) == 0 {
		t.Fatal("the dashboard queries no metric")
	}
	// The alert rules may only query what klbr-core exposes too (and up,
	// Prometheus's own).
	_, exprs := readRules(t)
	for _, e := range exprs {
		for _, n := range promqlMetrics(e) {
			if n != "up" {
				queried[n] = append(queried[n], "alert rule "+e)
			}
		}
	}
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range queried {
			if !yield(n) {
				return
			}
		}
	}) {
		switch {
		case liveNames[n]:
		case registryNames[n]:
			t.Logf("%s: exposed once first observed: a hook runs, a model answers (checked on the daemon's registry)", n)
		default:
			t.Errorf("%s, queried by %s, is not a metric klbr-core exposes", n, strings.Join(queried[n], ", "))
		}
	}
}
