package hosts

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosttest"
)

// cfgHost is a host that is never dialled: the test reads the engine's
// own bookkeeping only.
func cfgHost(name, addr string, maxJobs int, labels ...string) Host {
	return Host{Name: name, Target: config.SSHTarget{User: "klbr", Host: addr, Port: 22},
		IdentityFile: "/id", KnownHostsFile: "/kh", MaxJobs: maxJobs, Labels: labels}
}

func statusNames(e *Engine) []string {
	var out []string
	for _, s := range e.Statuses() {
		out = append(out, s.Name)
	}
	return out
}

// Reconfigure (a reload of [hosts]): a host added takes work at once and
// is listed; a removed one refuses new work, naming the hosts there are,
// and is no longer listed, while its running units stay reachable; a
// changed one has its new settings, and the job slots taken before the
// change stay counted and are given back to it.
func TestReconfigureHosts(t *testing.T) {
	e, err := New(Config{Hosts: map[string]Host{"a": cfgHost("a", "10.0.0.1", 1), "b": cfgHost("b", "10.0.0.2", 1)},
		ControlDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, releaseA, err := e.Reserve("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Reserve("a"); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a second job on a (max_jobs 1): %v", err)
	}
	oldSock := e.conns["a"].sock

	got := e.Reconfigure(map[string]Host{"a": cfgHost("a", "10.0.0.1", 2, "big"), "c": cfgHost("c", "10.0.0.3", 1, "big")})
	if !slices.Equal(got.Added, []string{"c"}) || !slices.Equal(got.Changed, []string{"a"}) || !slices.Equal(got.Removed, []string{"b"}) {
		t.Fatalf("changes = %+v", got)
	}
	if names := statusNames(e); !slices.Equal(names, []string{"a", "c"}) {
		t.Fatalf("statuses list %v, want a and c", names)
	}
	if h, _, err := e.Reserve("c"); err != nil || h != "c" {
		t.Fatalf("reserve on the added host: %q %v", h, err)
	}
	_, _, err = e.Reserve("b")
	if !errors.Is(err, ErrUnknownHost) || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), "a, c") {
		t.Fatalf("reserve on the removed host: %v", err)
	}
	if err := e.Check("label:big"); err != nil || !slices.Equal(e.Matches("label:big"), []string{"a", "c"}) {
		t.Fatalf("label:big matches %v (%v)", e.Matches("label:big"), err)
	}
	if _, ok := e.Host("b"); ok {
		t.Fatal("Host still knows the removed host")
	}
	if _, err := e.conn("b"); err != nil {
		t.Fatalf("the removed host's running units are unreachable: %v", err)
	}
	// a: max_jobs 2, the slot taken before the change still counts.
	if e.conns["a"].sock != oldSock {
		t.Fatal("a's ssh settings did not change, yet its connection was replaced")
	}
	_, releaseA2, err := e.Reserve("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Reserve("a"); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a third job on a (max_jobs 2, two taken): %v", err)
	}
	releaseA()
	releaseA2()
	for _, s := range e.Statuses() {
		if s.Name == "a" && (s.Reserved != 0 || s.MaxJobs != 2) {
			t.Fatalf("a after both releases: %+v", s)
		}
	}
	// A changed ssh target: a connection of its own.
	e.Reconfigure(map[string]Host{"a": cfgHost("a", "10.0.0.9", 2), "c": cfgHost("c", "10.0.0.3", 1, "big")})
	if e.conns["a"].sock == oldSock {
		t.Fatal("a's ssh target changed, yet it keeps its old connection")
	}
	// The removed host back: known again.
	if got := e.Reconfigure(map[string]Host{"a": cfgHost("a", "10.0.0.9", 2), "b": cfgHost("b", "10.0.0.2", 1)}); !slices.Equal(got.Added, []string{"b"}) || !slices.Equal(got.Removed, []string{"c"}) {
		t.Fatalf("changes = %+v", got)
	}
	if h, _, err := e.Reserve("b"); err != nil || h != "b" {
		t.Fatalf("reserve on the host added back: %q %v", h, err)
	}
}

// Reconfigure against a real host: a change that keeps the ssh settings
// keeps the connection (no new dial); a removed host's running unit is
// still watched to its end and collected, while new work is refused; a
// changed identity closes the connection and the next command dials anew.
func TestReconfigureRealHost(t *testing.T) {
	h := hosttest.Start(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	const unit = "klbr-job-9-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: unit, Description: "test", Argv: []string{"sh", "-c", "sleep 2; echo finished"}}); err != nil {
		t.Fatal(err)
	}
	if e.Dials() != 1 {
		t.Fatalf("%d dials after the first start", e.Dials())
	}
	lab, _ := e.Host("lab")
	more := lab
	more.MaxJobs = 5
	if c := e.Reconfigure(map[string]Host{"lab": more}); !slices.Equal(c.Changed, []string{"lab"}) {
		t.Fatalf("changes = %+v", c)
	}
	if st, err := e.State(ctx, "lab", unit); err != nil || !st[0].Exists() || e.Dials() != 1 {
		t.Fatalf("state after a max_jobs change: %+v %v, %d dials (want the connection kept)", st, err, e.Dials())
	}
	// Removed: no new work, the running unit is still watched.
	if c := e.Reconfigure(map[string]Host{}); !slices.Equal(c.Removed, []string{"lab"}) {
		t.Fatalf("changes = %+v", c)
	}
	if _, _, err := e.Reserve("lab"); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("reserve on the removed host: %v", err)
	}
	if st := waitEnded(t, e, unit); func() int { c, _ := st.Outcome(); return c }() != 0 {
		t.Fatalf("the removed host's unit: %+v", st)
	}
	var out bytes.Buffer
	if _, err := e.Output(ctx, "lab", unit, 1<<20, &out); err != nil || !strings.Contains(out.String(), "finished") {
		t.Fatalf("output of the removed host's unit: %q %v", out.String(), err)
	}
	if err := e.Collect(ctx, "lab", unit); err != nil {
		t.Fatal(err)
	}
	// Back with another identity file (the same key): a new connection.
	key, err := os.ReadFile(lab.IdentityFile)
	if err != nil {
		t.Fatal(err)
	}
	other := more
	other.IdentityFile = filepath.Join(t.TempDir(), "id")
	if err := os.WriteFile(other.IdentityFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if c := e.Reconfigure(map[string]Host{"lab": other}); !slices.Equal(c.Added, []string{"lab"}) {
		t.Fatalf("changes = %+v", c)
	}
	if _, err := e.State(ctx, "lab", unit); err != nil || e.Dials() != 2 {
		t.Fatalf("state with the new identity: %v, %d dials (want a second)", err, e.Dials())
	}
}
