package hosts

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
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
