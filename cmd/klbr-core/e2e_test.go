package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

// These tests run the real klbr-core binary against a real data directory:
// init, serve, the CLI over control.sock, the HTTP listener, and drains.

var buildOnce struct {
	sync.Once
	bin string
	err error
}

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "klbr-bin-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.bin = filepath.Join(dir, "klbr-core")
		out, err := exec.Command("go", "build", "-o", buildOnce.bin, ".").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v: %s", err, out)
			return
		}
		// klbr-core finds klbr-kernel beside itself.
		out, err = exec.Command("go", "build", "-o", filepath.Join(dir, "klbr-kernel"), "../klbr-kernel").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build klbr-kernel: %v: %s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.bin
}

type instance struct {
	t    *testing.T
	bin  string
	dir  string
	env  []string
	sock string
}

func newInstance(t *testing.T) *instance {
	t.Helper()
	dir, err := os.MkdirTemp("", "klbr-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"KLBR_DATA_DIR=" + data, "KLBR_BIND_ADDR=127.0.0.1:0", "KLBR_WORKSPACE=" + dir,
	}
	return &instance{t: t, bin: binary(t), dir: data, env: env, sock: filepath.Join(data, "control.sock")}
}

// run runs one CLI command to completion.
func (in *instance) run(extraEnv []string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(in.bin, args...)
	cmd.Env = append(append([]string{}, in.env...), extraEnv...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func (in *instance) must(args ...string) string {
	in.t.Helper()
	out, errOut, err := in.run(nil, args...)
	if err != nil {
		in.t.Fatalf("klbr-core %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

type server struct {
	cmd    *exec.Cmd
	url    string
	exited chan error
	stderr *strings.Builder
	mu     *sync.Mutex
}

var servingLine = regexp.MustCompile(`open (http://127\.0\.0\.1:\d+/)`)

// serve starts klbr-core serve and waits until it says where it serves.
func (in *instance) serve() *server {
	in.t.Helper()
	cmd := exec.Command(in.bin, "serve")
	cmd.Env = in.env
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		in.t.Fatal(err)
	}
	s := &server{cmd: cmd, exited: make(chan error, 1), stderr: &strings.Builder{}, mu: &sync.Mutex{}}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	go func() { err := cmd.Wait(); pw.Close(); s.exited <- err }()
	in.t.Cleanup(func() {
		cmd.Process.Kill()
	})
	select {
	case s.url = <-urlc:
	case err := <-s.exited:
		in.t.Fatalf("serve exited: %v\n%s", err, s.log())
	case <-time.After(20 * time.Second):
		in.t.Fatalf("serve did not come up:\n%s", s.log())
	}
	return s
}

func (s *server) log() string { s.mu.Lock(); defer s.mu.Unlock(); return s.stderr.String() }

func (s *server) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.exited:
		// Nothing the daemon placed may outlive it: in cgroup mode every
		// worker's cgroup is named with the daemon's pid.
		left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/pids/klbr-*-p%d", s.cmd.Process.Pid))
		if len(left) > 0 {
			t.Errorf("cgroups left behind by klbr-core: %v", left)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("klbr-core did not exit:\n%s", s.log())
		return nil
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNewcomerPath(t *testing.T) {
	in := newInstance(t)

	// serve before init says what to do.
	if _, errOut, err := in.run(nil, "serve"); err == nil || !strings.Contains(errOut, "klbr-core init") {
		t.Fatalf("serve before init: %v %s", err, errOut)
	}
	// doctor fails on an uninitialized directory, saying what to do.
	if out, _, err := in.run(nil, "doctor"); err == nil || !strings.Contains(out, "FAIL data") || !strings.Contains(out, "klbr-core init") {
		t.Fatalf("doctor before init: %v\n%s", err, out)
	}
	if out := in.must("init"); !strings.Contains(out, "created") || !strings.Contains(out, "session default created") {
		t.Fatalf("init: %s", out)
	}
	if out := in.must("init"); strings.Contains(out, "created") {
		t.Fatalf("second init created something: %s", out)
	}
	if fi, err := os.Stat(filepath.Join(in.dir, "operator-token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("operator token: %v %v", fi, err)
	}

	// A non-loopback bind is refused before anything else happens.
	if _, errOut, err := in.run([]string{"KLBR_BIND_ADDR=0.0.0.0:8765"}, "serve"); err == nil || !strings.Contains(errOut, "loopback") {
		t.Fatalf("non-loopback bind: %v %s", err, errOut)
	}

	srv := in.serve()
	// A second daemon on the same data directory refuses, naming the holder.
	_, errOut, err := in.run(nil, "serve")
	if err == nil || !strings.Contains(errOut, fmt.Sprintf("held by klbr-core pid %d", srv.cmd.Process.Pid)) {
		t.Fatalf("second serve: %v %s", err, errOut)
	}
	if fi, err := os.Stat(in.sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v %v", fi, err)
	}

	// Everything below works with no model configured.
	id := strings.TrimSpace(in.must("send", "default", "hello, klbr"))
	if !regexp.MustCompile(`^\d+$`).MatchString(id) {
		t.Fatalf("send printed %q, want the input id", id)
	}
	lines := inputLines(t, in.must("tail", "default", "--json"))
	if len(lines) != 1 {
		t.Fatalf("tail: %q", lines)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"seq", "id", "lane", "kind", "at", "content"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("tail record lacks %q: %s", k, lines[0])
		}
	}
	if rec["lane"] != "input" || rec["content"].(map[string]any)["text"] != "hello, klbr" {
		t.Fatalf("tail record: %s", lines[0])
	}
	var st api.Status
	if err := json.Unmarshal([]byte(in.must("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	// No route is configured: the agent runs on the seed defaults
	// (localhost:8001…), takes the input and retries while nothing answers.
	if len(st.Sessions) != 1 || st.Sessions[0].ID != "default" || st.PID != srv.cmd.Process.Pid ||
		(st.Sessions[0].Pending != 1 && st.Sessions[0].State != "running") || !strings.Contains(st.Agent, "using seed defaults http://localhost:8001/v1") {
		t.Fatalf("status: %+v", st)
	}
	if out := in.must("status", "default"); !strings.Contains(out, "default") {
		t.Fatalf("status default: %s", out)
	}
	if out := in.must("doctor"); !strings.Contains(out, fmt.Sprintf("held by klbr-core pid %d", srv.cmd.Process.Pid)) {
		t.Fatalf("doctor while serving: %s", out)
	}
	if code, body := get(t, srv.url+"healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz: %d %s", code, body)
	}
	_, metrics := get(t, srv.url+"metrics")
	for _, want := range []string{
		// Pending or taken by the agent on the seed defaults: either way counted.
		`klbr_inbox_pending_inputs{session="default",source_kind="operator"}`,
		`klbr_admissions_total{result="accepted",source_kind="operator"} 1`,
		`klbr_sqlite_info{`, `klbr_build_info{`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// tail with a cursor past the last record says so and what to do, with or without
	// --follow, instead of printing nothing (or waiting in silence).
	for _, extra := range [][]string{nil, {"--follow"}} {
		args := append([]string{"tail", "default", "--since", "999999999"}, extra...)
		if out, errOut, err := in.run(nil, args...); err == nil || !strings.Contains(errOut, "past the last record") ||
			!strings.Contains(errOut, "read from 0") {
			t.Fatalf("tail %v past the last record: %v, stdout %q, stderr %q", extra, err, out, errOut)
		}
	}

	// tail --follow sees a new input, then ends when the daemon drains.
	follow := exec.Command(in.bin, "tail", "default", "--since", fmt.Sprint(rec["seq"]), "--follow", "--json")
	follow.Env = in.env
	fout, _ := follow.StdoutPipe()
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	in.must("send", "default", "second")
	// The agent's notices (it runs on the seed defaults) may come first.
	fr := bufio.NewReader(fout)
	var line string
	for i := 0; i < 20 && !strings.Contains(line, `"text":"second"`); i++ {
		if line, err = fr.ReadString('\n'); err != nil {
			break
		}
	}
	if err != nil || !strings.Contains(line, `"text":"second"`) {
		t.Fatalf("follow: %q %v", line, err)
	}

	// drain: the daemon exits 0 and the CLI waits for it.
	if _, errOut, err := in.run(nil, "drain"); err != nil || !strings.Contains(errOut, "has exited") {
		t.Fatalf("drain: %v %s", err, errOut)
	}
	if err := srv.wait(t); err != nil {
		t.Fatalf("daemon exit after drain: %v\n%s", err, srv.log())
	}
	if err := follow.Wait(); err != nil {
		t.Fatalf("follow after drain: %v", err)
	}
	if _, err := os.Stat(in.sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left behind: %v", err)
	}

	// The inputs are still there after a restart; SIGTERM drains and exits 0.
	srv = in.serve()
	if lines := inputLines(t, in.must("tail", "default", "--json")); len(lines) != 2 {
		t.Fatalf("after restart: %q", lines)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, srv.log())
	}
	if !strings.Contains(srv.log(), "drained") {
		t.Errorf("no drain in the log:\n%s", srv.log())
	}
}

// Inputs sent while a drain begins are either acknowledged (and then stored)
// or refused with a clear draining error. Nothing in between.
func TestDrainUnderLoadLosesNothingAcknowledged(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	c := localclient.New(in.sock)
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	acked := map[int64]string{}
	refused := 0
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				res, err := c.Send(ctx, "default", api.SendRequest{Text: "load", SourceKey: key})
				var e *localclient.Error
				switch {
				case err == nil:
					mu.Lock()
					acked[res.ID] = key
					mu.Unlock()
				case errors.As(err, &e) && e.Status == 503 && e.Code == api.CodeDraining:
					mu.Lock()
					refused++
					mu.Unlock()
					return
				case errors.Is(err, localclient.ErrUnreachable):
					return // the daemon has exited
				default:
					t.Errorf("send %s: %v", key, err)
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if _, errOut, err := in.run(nil, "drain"); err != nil {
		t.Fatalf("drain: %v %s", err, errOut)
	}
	wg.Wait()
	if err := srv.wait(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
	if len(acked) == 0 {
		t.Fatal("no input was acknowledged before the drain")
	}
	st, err := store.Open(context.Background(), in.dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	items, err := st.Inbox(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int64]bool{}
	for _, it := range items {
		stored[it.InputID] = true
	}
	for id, key := range acked {
		if !stored[id] {
			t.Fatalf("acknowledged input %d (%s) is missing after the drain", id, key)
		}
	}
	t.Logf("%d acknowledged and stored, %d refused while draining, %d stored in all", len(acked), refused, len(items))
}

// A broken klbr.toml stops serve with the line at fault, but never keeps the
// operator from reaching a daemon that is already running.
func TestBrokenConfigIsNamedByLine(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	conf := filepath.Join(in.dir, "klbr.toml")
	if err := os.WriteFile(conf, []byte("[agent]\nroute = \"main\"\n\n[routes.main]\nurl = \"ftp://nowhere\"\nmodel = \"m\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := in.run(nil, "doctor")
	if err == nil || !strings.Contains(out, "klbr.toml:5:") || !strings.Contains(out, "routes.main.url") || !strings.Contains(out, "ok   data") {
		t.Fatalf("doctor with a broken config: %v\n%s", err, out)
	}
	if out := in.must("status"); !strings.Contains(out, "default") {
		t.Fatalf("status with a broken config: %s", out)
	}
	if _, errOut, err := in.run(nil, "stop"); err != nil {
		t.Fatalf("stop with a broken config: %v %s", err, errOut)
	}
	if err := srv.wait(t); err != nil {
		t.Fatalf("exit after stop: %v", err)
	}
	if _, errOut, err := in.run(nil, "serve"); err == nil || !strings.Contains(errOut, "klbr.toml:5:") {
		t.Fatalf("serve with a broken config: %v %s", err, errOut)
	}
}

// inputLines keeps the input-lane records of tail --json output.
func inputLines(t *testing.T, out string) []string {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct{ Lane string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("tail line %q: %v", line, err)
		}
		if r.Lane == "input" {
			keep = append(keep, line)
		}
	}
	return keep
}

// A route that cannot be built (api_key_env names an unset variable) does
// not keep serve from starting: inputs are admitted, the agent is disabled
// with the reason in status, /metrics and the log, and doctor reports it as
// a FAIL line while still running its other checks.
func TestServeWithoutABuildableRoute(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	conf := filepath.Join(in.dir, "klbr.toml")
	if err := os.WriteFile(conf, []byte("[agent]\nroute = \"main\"\n\n[routes.main]\nurl = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"KLBR_TEST_UNSET_KEY\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := in.run(nil, "doctor")
	if err == nil || !strings.Contains(out, "FAIL route") || !strings.Contains(out, "KLBR_TEST_UNSET_KEY is not set") {
		t.Fatalf("doctor with an unbuildable route: %v\n%s", err, out)
	}
	for _, want := range []string{"ok   config", "ok   data", "ok   lock", "python"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor stopped before %q:\n%s", want, out)
		}
	}
	srv := in.serve()
	in.must("send", "default", "kept for later")
	st := in.must("status")
	if !strings.Contains(st, "agent: not running: route main cannot be built") || !strings.Contains(st, "KLBR_TEST_UNSET_KEY") {
		t.Fatalf("status: %s", st)
	}
	if !strings.Contains(srv.log(), "the agent does not run: its model route cannot be built") {
		t.Fatalf("log:\n%s", srv.log())
	}
	if _, m := get(t, srv.url+"metrics"); !strings.Contains(m, "klbr_agent_running 0") {
		t.Fatalf("metrics lack klbr_agent_running 0")
	}
}

// open asks the running daemon: the URL has the address it bound (here a
// port the kernel chose) and a token that opens the browser's status; with
// no daemon it says so and exits 1.
func TestOpenAsksTheDaemon(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	_, errOut, err := in.run(nil, "open")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errOut, "not reachable") {
		t.Fatalf("open with no daemon: %v %q", err, errOut)
	}
	srv := in.serve()
	// From another shell: no KLBR_BIND_ADDR, the daemon bound 127.0.0.1:0.
	out, errOut, err := in.run([]string{"KLBR_BIND_ADDR="}, "open")
	if err != nil {
		t.Fatalf("open: %v %s", err, errOut)
	}
	u := strings.TrimSpace(out)
	if !strings.HasPrefix(u, srv.url+"?token=") {
		t.Fatalf("open printed %q; the daemon serves %s", u, srv.url)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.url+"v2/status", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimPrefix(u, srv.url+"?token="))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the printed token does not open the browser's status: %d", resp.StatusCode)
	}
	// --rotate: a new token; the old one no longer opens anything.
	out, errOut, err = in.run([]string{"KLBR_BIND_ADDR="}, "open", "--rotate")
	if err != nil || !strings.Contains(errOut, "signed out") {
		t.Fatalf("open --rotate: %v %q", err, errOut)
	}
	rotated := strings.TrimSpace(out)
	if rotated == u || !strings.HasPrefix(rotated, srv.url+"?token=") {
		t.Fatalf("open --rotate printed %q (before %q)", rotated, u)
	}
	for tok, want := range map[string]int{strings.TrimPrefix(u, srv.url+"?token="): 401, strings.TrimPrefix(rotated, srv.url+"?token="): 200} {
		req, _ := http.NewRequest(http.MethodGet, srv.url+"v2/status", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("after the rotation a token answers %d, want %d", resp.StatusCode, want)
		}
	}
	if out, _, _ := in.run([]string{"KLBR_BIND_ADDR="}, "open"); strings.TrimSpace(out) != rotated {
		t.Errorf("open after the rotation printed %q, want %q", out, rotated)
	}
}
