package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// doctor, status and the browser never disagree about the route in force:
// doctor asks the running daemon what it runs, and says when klbr.toml
// changed since the daemon read it (not reloaded yet, or refused).
func TestDoctorNamesTheRouteInForce(t *testing.T) {
	a, b := modeltest.New(), modeltest.New()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	a.ListModels("model-a")
	b.ListModels("model-b")
	in := newInstance(t)
	in.must("init")
	conf := filepath.Join(in.dir, "klbr.toml")
	write := func(route string) {
		t.Helper()
		body := fmt.Sprintf("[agent]\nroute = %q\n\n[routes.main]\nurl = %q\nmodel = \"model-a\"\n\n[routes.spare]\nurl = %q\nmodel = \"model-b\"\n", route, a.URL(), b.URL())
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	agentLine := regexp.MustCompile(`(?m)^agent: (.*)$`)
	status := func() string {
		t.Helper()
		m := agentLine.FindStringSubmatch(in.must("status"))
		if m == nil {
			t.Fatal("status has no agent line")
		}
		return m[1]
	}
	doctor := func() string {
		t.Helper()
		out, _, _ := in.run(nil, "doctor")
		return out
	}
	doctorAgent := regexp.MustCompile(`(?m)^(ok  |WARN|FAIL) agent +(.*)$`)
	inForce := func(out string) (mark, line string) {
		t.Helper()
		m := doctorAgent.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("doctor has no agent line:\n%s", out)
		}
		return m[1], m[2]
	}

	write("main")
	in.serve()
	st := status()
	if !strings.HasPrefix(st, "route main (model-a)") {
		t.Fatalf("status agent %q", st)
	}
	if mark, line := inForce(doctor()); mark != "ok  " || !strings.Contains(line, st) {
		t.Fatalf("doctor: %s %q; want ok and status's %q", mark, line, st)
	}

	// Edited, not reloaded: the daemon still runs route main, and doctor says so.
	write("spare")
	out := doctor()
	if mark, line := inForce(out); mark != "WARN" || !strings.Contains(line, st) || !strings.Contains(line, "changed since") {
		t.Fatalf("doctor after an edit: %s %q; want WARN naming %q and the change\n%s", mark, line, st, out)
	}
	if !strings.Contains(out, "klbr-core reload") {
		t.Fatalf("doctor after an edit does not say what to do:\n%s", out)
	}

	in.must("reload")
	st = status()
	if !strings.HasPrefix(st, "route spare (model-b)") {
		t.Fatalf("status agent after the reload %q", st)
	}
	if mark, line := inForce(doctor()); mark != "ok  " || !strings.Contains(line, st) {
		t.Fatalf("doctor after the reload: %s %q; want ok and status's %q", mark, line, st)
	}

	// A file that does not parse: the reload is refused, the daemon runs on
	// with route spare, and doctor says that as well as the file's error.
	if err := os.WriteFile(conf, []byte("[agent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.run(nil, "reload"); err == nil {
		t.Fatal("a broken klbr.toml was reloaded")
	}
	out = doctor()
	if mark, line := inForce(out); mark != "WARN" || !strings.Contains(line, st) {
		t.Fatalf("doctor with a broken file: %s %q; want WARN naming %q\n%s", mark, line, st, out)
	}
	if !strings.Contains(out, "FAIL config") {
		t.Fatalf("doctor with a broken file does not fail its config check:\n%s", out)
	}
}

// status shows each error once, however many lines it concerns (the
// attempt that failed, what woke the next, the retry), with how many in a
// row and when the last was; the sandbox is one line, and doctor --verbose
// gives its paragraph.
func TestStatusSaysEachErrorOnce(t *testing.T) {
	gone := modeltest.New()
	url := gone.URL()
	gone.Close()
	in := newInstance(t)
	in.must("init")
	conf := filepath.Join(in.dir, "klbr.toml")
	body := fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 200\n\n[routes.main]\nurl = %q\nmodel = \"m\"\n", url)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	in.serve()
	in.must("send", "default", "hello?")
	var st string
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = in.must("status")
		if strings.Contains(st, "failed in a row") && strings.Count(st, "attempt ") > 0 && strings.Contains(st, "woke by: resumed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session did not retry a second attempt:\n%s", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := strings.Count(st, "connection refused"); n != 1 {
		t.Errorf("status names the error %d times, want once:\n%s", n, st)
	}
	var sb string
	for _, l := range strings.Split(st, "\n") {
		if strings.HasPrefix(l, "sandbox: ") {
			sb = l
		}
	}
	if sb == "" || len(sb) > 160 {
		t.Errorf("status's sandbox is not one short line (%d chars): %q", len(sb), sb)
	}
	brief, _, _ := in.run(nil, "doctor")
	verbose, _, _ := in.run(nil, "doctor", "--verbose")
	if strings.Contains(brief, "Landlock grants") || !strings.Contains(verbose, "Landlock grants") || !strings.Contains(brief, "doctor --verbose") {
		t.Errorf("doctor's sandbox line should be short, and --verbose give the paragraph:\n%s\n--- verbose:\n%s", brief, verbose)
	}
	if strings.Contains(brief, "sqlite compile options") || !strings.Contains(verbose, "sqlite compile options") {
		t.Errorf("SQLite's compile options belong to doctor --verbose")
	}
}

// doctor lists the skills each session's active release offers, not only
// the default tree's: a session moved to a release with a skill of its own
// has it listed under that release.
func TestDoctorListsTheActiveReleasesSkills(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	in.serve()
	initial := releases(t, in).Sessions[0].Release
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	if err := os.MkdirAll(filepath.Join(draft, "skills", "tidepools"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(draft, "skills", "tidepools", "SKILL.md"), []byte("# tidepools\nReading tide tables.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(in.must("publish", draft))
	in.must("activate", "default", "1", id)
	out, _, _ := in.run(nil, "doctor")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "release "+id[:12]) {
			line = l
		}
	}
	if !strings.Contains(line, "tidepools") || !strings.Contains(line, "default") {
		t.Fatalf("doctor does not list release %.12s's skills for session default:\n%s", id, out)
	}
}
