package observe

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workertest"
)

const childEnv = "KLBR_OBSERVE_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		runChild(dir)
		return
	}
	os.Exit(m.Run())
}

// runChild is a klbr-core reduced to what observers need: the store, the
// hook dispatcher (a real hook worker) and the observer runner. It prints
// "ready", then "delivered <outcome>" after each delivery's transaction.
func runChild(dir string) {
	ctx := context.Background()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	rel, _ := behavior.Open(filepath.Join(dir, "releases"))
	placer, err := placement.Detect(ctx, placement.Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	hk := hooks.New(hooks.Config{Store: st, Releases: rel, Kernel: os.Getenv("KLBR_T_KERNEL"), Python: os.Getenv("KLBR_T_PYTHON"),
		RuntimeSrc: os.Getenv("KLBR_T_RUNTIME"), Workspace: dir, Placer: placer})
	r := New(Config{Store: st, Hooks: hk, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxAttempts: 1000,
		Limits:  store.LoopLimits{MaxDepth: 3, Quota: 1000, Window: time.Minute},
		Observe: func(_, outcome string, _ time.Duration) { fmt.Println("delivered", outcome) }})
	r.Start("s")
	fmt.Println("ready")
	select {}
}

// child is a running runChild, in its own process group with its hook worker.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startChild(t *testing.T, dir string, env workertest.Env) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, "KLBR_T_KERNEL="+env.Kernel, "KLBR_T_PYTHON="+env.Python, "KLBR_T_RUNTIME="+env.Runtime)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	c.await(t, "ready")
	return c
}

// await reads lines until one starts with prefix.
func (c *child) await(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the child ended before %q", prefix)
			}
			if strings.HasPrefix(l, "error") {
				t.Fatal(l)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q from the child", prefix)
		}
	}
}

// kill SIGKILLs the child and its hook worker (its process group).
func (c *child) kill() {
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	c.cmd.Wait()
}

// markers returns the pids of the hook workers that were invoked for text.
func markers(dir, text string) []int {
	names, _ := filepath.Glob(filepath.Join(dir, "invoked-"+text+"-*"))
	var pids []int
	for _, n := range names {
		pid, _ := strconv.Atoi(n[strings.LastIndex(n, "-")+1:])
		pids = append(pids, pid)
	}
	return pids
}

func awaitMarker(t *testing.T, dir, text string) []int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if p := markers(dir, text); len(p) > 0 {
			return p
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("the observer was never invoked for %q", text)
	return nil
}

// "Observer crash and revision replay": the hook worker is SIGKILLed
// during a delivery, and klbr-core (here: a process running the store, the
// hook dispatcher and the observer runner) is SIGKILLed before and after an
// observer's commit, 20 times each. No delivery is acknowledged twice, no
// local command is minted or carried out twice, and the state counts every
// event exactly once.
func TestObserverCrashAndReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("60 crashes")
	}
	env := workertest.Setup(t)
	dir := t.TempDir()
	marks := t.TempDir()
	const rounds = 20
	func() {
		f := newFixtureAt(t, dir)
		defer f.close()
		f.release(fmt.Sprintf(`
def count(inp):
    ev, st = inp["event"], inp["state"]
    text = ev["data"].get("text")
    open(%q + "/invoked-%%s-%%d" %% (text, os.getpid()), "w").close()
    time.sleep(0.15)
    n = st.get("n", 0) + 1
    return {"state": {"n": n}, "commands": [{"op": "local.send", "args": {"text": "seen %%d: %%s" %% (n, text)}}]}
SLOTS["crash.count"] = count
`, marks), "[[hooks.observers]]\nhandler = \"crash.count\"\nevents = [\"input.accepted\"]\nstate_version = 1\n")
		// The binding exists before the first input.
		if _, err := New(Config{Store: f.st, Hooks: f.hk}).Pass(context.Background(), "s"); err != nil {
			t.Fatal(err)
		}
	}()
	admit := func(text string) {
		f := newFixtureAt(t, dir)
		defer f.close()
		f.admit(text)
	}
	killedWorkers := 0
	for i := range 3 * rounds {
		text := fmt.Sprintf("in%d", i)
		admit(text)
		c := startChild(t, dir, env)
		switch i % 3 {
		case 0: // the hook worker dies during the delivery; the runner retries
			pids := awaitMarker(t, marks, text)
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err == nil {
				killedWorkers++
			}
			c.await(t, "delivered ok")
			c.kill()
		case 1: // klbr-core dies during the delivery, before its commit
			awaitMarker(t, marks, text)
			c.kill()
		case 2: // klbr-core dies right after the commit (commands maybe not yet carried out)
			awaitMarker(t, marks, text)
			c.await(t, "delivered ok")
			c.kill()
		}
	}
	// One more run carries out whatever is left.
	c := startChild(t, dir, env)
	deadline := time.Now().Add(90 * time.Second)
	for {
		time.Sleep(300 * time.Millisecond)
		if len(markers(marks, fmt.Sprintf("in%d", 3*rounds-1))) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last input was never delivered")
		}
	}
	time.Sleep(2 * time.Second)
	c.kill()

	f := newFixtureAt(t, dir)
	defer f.close()
	ctx := context.Background()
	// Let the runner finish in-process (same store, same behavior).
	r := New(Config{Store: f.st, Hooks: f.hk, Limits: store.LoopLimits{MaxDepth: 3, Quota: 1000, Window: time.Minute}})
	f.drain(r)
	stats, _ := f.st.ObserverStats(ctx)
	if len(stats) != 1 || stats[0].Done != 3*rounds || stats[0].Backlog != 0 || stats[0].DeadLetters != 0 {
		t.Fatalf("stats: %+v", stats)
	}
	cmds, _ := f.st.ObserverCommands(ctx, "s")
	if len(cmds) != 3*rounds {
		t.Fatalf("%d commands for %d deliveries: a retried delivery minted commands", len(cmds), 3*rounds)
	}
	seen := map[string]bool{}
	for _, sp := range f.speech() {
		if seen[string(sp.Content)] {
			t.Fatalf("a local command was carried out twice: %s", sp.Content)
		}
		seen[string(sp.Content)] = true
	}
	if len(seen) != 3*rounds {
		for _, c := range cmds {
			t.Logf("command %d %s %s %s", c.ID, c.State, c.Args, c.Result)
		}
		t.Fatalf("%d sends for %d commands", len(seen), 3*rounds)
	}
	for i := range 3 * rounds {
		found := false
		for s := range seen {
			found = found || strings.Contains(s, fmt.Sprintf(": in%d\"", i))
		}
		if !found {
			t.Errorf("no send for in%d", i)
		}
	}
	if st, _, _ := f.st.HookState(ctx, "s", "crash.count"); string(st) != fmt.Sprintf(`{"n":%d}`, 3*rounds) {
		t.Errorf("state %s: an event was counted twice or not at all", st)
	}
	if killedWorkers < rounds {
		t.Errorf("only %d hook workers were killed", killedWorkers)
	}
	retried := 0
	for i := range 3 * rounds {
		if len(markers(marks, fmt.Sprintf("in%d", i))) > 1 {
			retried++
		}
	}
	if retried < 2*rounds {
		t.Errorf("only %d deliveries were made again after a crash before their commit", retried)
	}
	// A replay goes over the same events with fake effects: nothing is minted.
	res, err := r.Replay(ctx, "s", "crash.count", 0, 0)
	if err != nil || len(res) != 3*rounds {
		t.Fatalf("replay: %d, %v", len(res), err)
	}
	for _, rr := range res {
		if rr.Problem != "" || len(rr.Commands) != 1 {
			t.Fatalf("replayed: %+v", rr)
		}
	}
	if after, _ := f.st.ObserverCommands(ctx, "s"); len(after) != len(cmds) || len(f.speech()) != 3*rounds {
		t.Errorf("a replay had effects")
	}
}
