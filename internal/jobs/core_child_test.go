package jobs

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// envCore makes the test binary a klbr-core's worth of jobs (coreMain)
// instead of running tests: a process of its own that a test can SIGKILL.
const envCore = "KLBR_JOBS_TEST_CORE"

func TestMain(m *testing.M) {
	if c := os.Getenv(envCore); c != "" {
		coreMain(c)
		return
	}
	os.Exit(m.Run())
}

// coreConfig is what a core child runs with.
type coreConfig struct {
	Data      string     `json:"data"`
	Control   string     `json:"control"` // the SSH control directory
	Host      hosts.Host `json:"host"`
	SSH       string     `json:"ssh"`
	MaxWall   float64    `json:"max_wall"` // seconds; 0: the default
	DownGrace float64    `json:"down_grace"`
}

// coreMain runs jobs over the data directory and the one host of cfg, and
// obeys lines on stdin: `run JSON` (a CommandSpec; answers `job ID`) and
// `cancel ID` (answers `cancelled STATE`). It runs until killed.
func coreMain(raw string) {
	var c coreConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, "core:", err)
		os.Exit(2)
	}
	tg, err := config.ParseSSHTarget(c.SSH)
	if err != nil {
		fmt.Fprintln(os.Stderr, "core:", err)
		os.Exit(2)
	}
	c.Host.Target = tg
	c.Host.DownGrace = time.Duration(c.DownGrace * float64(time.Second))
	ctx := context.Background()
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, ControlDir: c.Control, Hosts: map[string]hosts.Host{c.Host.Name: c.Host}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "core:", err)
		os.Exit(2)
	}
	st, err := store.Open(ctx, c.Data, store.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "core:", err)
		os.Exit(2)
	}
	m := New(Config{Store: st, Workspace: c.Data, Hosts: eng, HostPoll: 50 * time.Millisecond, MaxConcurrent: 64,
		MaxWall: time.Duration(c.MaxWall * float64(time.Second))})
	if err := m.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "core:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "run":
			var s CommandSpec
			if err := json.Unmarshal([]byte(arg), &s); err != nil {
				fmt.Println("error", err)
				continue
			}
			j, err := m.Run(ctx, RunRequest{Session: "default", Spec: s})
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("job", j.ID)
		case "cancel":
			id, _ := strconv.ParseInt(arg, 10, 64)
			j, err := m.Cancel(ctx, id)
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("cancelled", j.State)
		}
	}
	select {} // until killed
}

// coreLab is a booted host and a data directory that core children,
// started and SIGKILLed one after another, share.
type coreLab struct {
	t     *testing.T
	h     *hosttest.Host
	cfg   coreConfig
	child *coreChild
	rd    *store.Store
}

type coreChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	log   *os.File
}

func newCoreLab(t *testing.T, h *hosttest.Host) *coreLab {
	t.Helper()
	h.InstallKernel(t) // every job on a host runs under it
	data := t.TempDir()
	st, err := store.Open(t.Context(), data, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(t.Context(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	ctl, err := os.MkdirTemp("", "klbr-ssh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctl) })
	l := &coreLab{t: t, h: h, cfg: coreConfig{Data: data, Control: ctl, SSH: h.SSH(), Host: hosts.Host{Name: "lab",
		IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile, MaxJobs: 64, MemoryMaxBytes: 64 << 20,
		TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}}
	t.Cleanup(func() {
		l.kill()
		if l.rd != nil {
			l.rd.Close()
		}
	})
	return l
}

// start starts a core child and waits until it has recovered and serves.
func (l *coreLab) start() {
	t := l.t
	t.Helper()
	raw, _ := json.Marshal(l.cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCore+"="+string(raw))
	logf, err := os.CreateTemp(t.TempDir(), "core-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &coreChild{cmd: cmd, in: in, lines: make(chan string, 16), log: logf}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	l.child = c
	if got := l.answer(); got != "ready" {
		t.Fatalf("the core child said %q, not ready", got)
	}
}

// answer is the child's next line.
func (l *coreLab) answer() string {
	l.t.Helper()
	select {
	case s, ok := <-l.child.lines:
		if !ok {
			l.t.Fatalf("the core child ended:\n%s", l.childLog())
		}
		return s
	case <-time.After(2 * time.Minute):
		l.t.Fatalf("the core child does not answer:\n%s", l.childLog())
	}
	return ""
}

func (l *coreLab) childLog() string {
	b, _ := os.ReadFile(l.child.log.Name())
	return string(b)
}

// run asks the child for a job on the host.
func (l *coreLab) run(argv ...string) int64 {
	l.t.Helper()
	spec, _ := json.Marshal(CommandSpec{Argv: argv, Host: "lab"})
	fmt.Fprintf(l.child.in, "run %s\n", spec)
	a := l.answer()
	id, err := strconv.ParseInt(strings.TrimPrefix(a, "job "), 10, 64)
	if err != nil {
		l.t.Fatalf("run: %q", a)
	}
	return id
}

// cancel asks the child to cancel job id and returns the state it says.
func (l *coreLab) cancel(id int64) string {
	l.t.Helper()
	fmt.Fprintf(l.child.in, "cancel %d\n", id)
	return l.answer()
}

// kill SIGKILLs the child, as the kernel's OOM killer or a power cut would.
func (l *coreLab) kill() {
	if l.child == nil {
		return
	}
	_ = l.child.cmd.Process.Signal(syscall.SIGKILL)
	_ = l.child.cmd.Wait()
	l.child.log.Close()
	l.child = nil
}

// job reads job id from the store, as the child wrote it.
func (l *coreLab) job(id int64) store.Job {
	l.t.Helper()
	if l.rd == nil {
		rd, err := store.OpenReader(l.t.Context(), l.cfg.Data)
		if err != nil {
			l.t.Fatal(err)
		}
		l.rd = rd
	}
	j, err := l.rd.Job(l.t.Context(), id)
	if err != nil {
		l.t.Fatal(err)
	}
	return j
}

// until polls cond until it holds, failing after limit.
func (l *coreLab) until(what string, limit time.Duration, cond func() bool) {
	l.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			log := ""
			if l.child != nil {
				log = l.childLog()
			}
			l.t.Fatalf("%s: not within %s\n%s", what, limit, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startsOf counts the unit names the marks of s carry.
func startsOf(t *testing.T, s *starts) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, l := range strings.Fields(s.String()) {
		n[l]++
	}
	return n
}

// markStart is the shell command that sends the unit's own name (from its
// control group) to s: one line is one start of that unit, ever. (A
// confined job writes no file outside its own directory; its network is
// the host's.)
func markStart(s *starts) string {
	return "grep -o 'klbr-job-[0-9]*-[0-9]*' /proc/self/cgroup | head -n 1 | " +
		"python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2]))).sendall(sys.stdin.buffer.read())' " +
		s.host + " " + s.port
}

// starts collects what every connection to a TCP port of the test's side
// of the host's link sends.
type starts struct {
	host, port string
	mu         sync.Mutex
	b          strings.Builder // guarded by mu
}

func (s *starts) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
func (s *starts) Reset()         { s.mu.Lock(); defer s.mu.Unlock(); s.b.Reset() }

func startsListener(t *testing.T, addr string) *starts {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	_, port, _ := net.SplitHostPort(l.Addr().String())
	s := &starts{host: addr, port: port}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(io.LimitReader(c, 1024))
			c.Close()
			s.mu.Lock()
			s.b.Write(b)
			s.mu.Unlock()
		}
	}()
	return s
}

// SIGKILL klbr-core 20 times at random points of remote dispatches (and of
// the restarts that reattach them): every attempt has at most one unit on
// the host, ever; every job ends with its unit's real outcome and output
// (none is unknown: no unit vanished); no unit is left running.
func TestRemoteDispatchSurvivesSIGKILL(t *testing.T) {
	const rounds = 20
	h := hosttest.Start(t)
	h.InstallKernel(t)
	l := newCoreLab(t, h)
	starts := startsListener(t, h.Gw)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	ended := startsListener(t, h.Gw)
	var ids []int64
	at := map[string]int{}
	for i := range rounds {
		l.start()
		id := l.run("sh", "-c", markStart(starts)+"; sleep 0.2; echo out; "+markStart(ended)+"; exit 3")
		ids = append(ids, id)
		// Each round waits for a phase of the dispatch (by turns: none,
		// the host recorded, the unit running, the unit's command ended),
		// then a random while more: the kill lands at a random point of
		// the phase that follows. Waits that do not come true in time end
		// the wait; the kill lands wherever the dispatch is then.
		phase := i % 4
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			j := l.job(id)
			unit := strings.TrimSuffix(UnitName(id, max(j.Runs, 1)), ".service")
			if phase == 0 || (phase == 1 && j.Host != "") || (phase == 2 && startsOf(t, starts)[unit] > 0) ||
				(phase == 3 && startsOf(t, ended)[unit] > 0) || j.State.Final() {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := time.Duration(rng.IntN(300)) * time.Millisecond
		time.Sleep(d) // where the kill lands, not an assertion
		l.kill()
		j := l.job(id)
		unit := strings.TrimSuffix(UnitName(j.ID, max(j.Runs, 1)), ".service")
		where := string(j.State)
		switch {
		case j.State == store.JobRunning && j.Host == "":
			where = "claimed, not placed"
		case j.State == store.JobRunning && startsOf(t, starts)[unit] == 0:
			where = "placed, unit not running yet"
		case j.State == store.JobRunning && startsOf(t, ended)[unit] == 0:
			where = "unit running"
		case j.State == store.JobRunning:
			where = "unit ended, its end not recorded"
		}
		at[where]++
		t.Logf("round %d: killed %s into phase %d: job %d %s", i, d, phase, j.ID, where)
	}
	t.Logf("where the kills landed: %v", at)
	l.start()
	for _, id := range ids {
		l.until(fmt.Sprintf("job %d final", id), 3*time.Minute, func() bool { return l.job(id).State.Final() })
	}
	n := startsOf(t, starts)
	for unit, c := range n {
		if c != 1 {
			t.Errorf("%s started %d times", unit, c)
		}
	}
	for _, id := range ids {
		j := l.job(id)
		unit := strings.TrimSuffix(UnitName(j.ID, j.Runs), ".service")
		if j.State != store.JobFailed || j.Error != "exit status 3 (on host lab)" || strings.TrimSpace(j.OutputPreview) != "out" || n[unit] != 1 {
			t.Errorf("job %d: %s %q after %d runs, output %q, its unit started %d times; want failed with exit status 3 and its output, started once",
				j.ID, j.State, j.Error, j.Runs, j.OutputPreview, n[unit])
		}
		for a := int64(1); a < j.Runs; a++ {
			if c := n[strings.TrimSuffix(UnitName(j.ID, a), ".service")]; c != 0 {
				t.Errorf("job %d: attempt %d started %d times, yet the job ran again", j.ID, a, c)
			}
		}
	}
	l.until("no klbr-job unit left on the host", time.Minute, func() bool {
		units, err := h.Units("klbr-job-*")
		return err == nil && len(units) == 0
	})
}

// SIGKILL klbr-core while a remote job runs, and restart: the job is
// reattached, never started again, and finishes with its real exit status
// and output. A job reattached so is cancelled like any: its unit and every
// process of it on the host are stopped.
func TestRemoteJobReattachedAfterSIGKILL(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	l := newCoreLab(t, h)
	starts := startsListener(t, h.Gw)
	l.start()
	id := l.run("sh", "-c", markStart(starts)+"; echo before; sleep 3; echo after; exit 5")
	unit := UnitName(id, 1)
	l.until("the unit runs", time.Minute, func() bool { return startsOf(t, starts)[strings.TrimSuffix(unit, ".service")] == 1 })
	l.kill()
	if out, _ := h.Enter("systemctl", "is-active", unit).Output(); strings.TrimSpace(string(out)) != "active" {
		t.Fatalf("killing klbr-core stopped the job's unit: %s", out)
	}
	l.start()
	l.until("the job ends", 2*time.Minute, func() bool { return l.job(id).State.Final() })
	j := l.job(id)
	if j.State != store.JobFailed || j.Error != "exit status 5 (on host lab)" || strings.TrimSpace(j.OutputPreview) != "before\nafter" || j.Runs != 1 {
		t.Fatalf("job %s %q runs %d, output %q; want failed with exit status 5 and all its output", j.State, j.Error, j.Runs, j.OutputPreview)
	}
	if n := startsOf(t, starts); len(n) != 1 || n[strings.TrimSuffix(unit, ".service")] != 1 {
		t.Fatalf("starts %v, want %s once", n, unit)
	}

	id = l.run("sh", "-c", markStart(starts)+"; sleep 1007 & sleep 1008; wait")
	unit = UnitName(id, 1)
	procs := func() []string {
		out, _ := h.Enter("pgrep", "-f", "sleep 100[78]").Output()
		return strings.Fields(string(out))
	}
	l.until("the job's processes run on the host", time.Minute, func() bool { return len(procs()) >= 3 })
	l.kill()
	l.start()
	if got := l.cancel(id); got != "cancelled cancelled" {
		t.Fatalf("cancel of the reattached job: %q", got)
	}
	if p := procs(); len(p) != 0 {
		t.Fatalf("processes of the cancelled job remain on the host: %v", p)
	}
	if units, err := h.Units(unit); err != nil || len(units) != 0 {
		t.Fatalf("the cancelled job's unit remains: %v %v", units, err)
	}
	if j := l.job(id); j.Runs != 1 || !strings.Contains(j.Error, "every process of it on the host were stopped") {
		t.Fatalf("job %s %q runs %d", j.State, j.Error, j.Runs)
	}
}
