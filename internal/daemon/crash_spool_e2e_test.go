package daemon

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

// A full disk while an artifact is spooled (seed 004 slice 12), with a real
// ENOSPC: <data>/artifacts is a tmpfs of 3 MiB and a cell prints 6 MiB.
// Without a kill the cell's outcome says the output could not be stored and
// why, the spool is gone and the daemon goes on serving. Then 20 times
// klbr-core is SIGKILLed while a spool fills the disk (half of the rounds at
// the instant the disk is full, before the spool is dropped; the others at
// varied points of the spooling): after each restart no spool is left,
// every acknowledged input is there, no cell is left running (the killed
// one is lost, and says so), and the daemon serves again.
func TestArtifactSpoolOnAFullDiskSurvivesSIGKILL(t *testing.T) {
	const rounds = 20
	requirePython(t)
	data, env := instance(t)
	arts := filepath.Join(data, "artifacts")
	if err := os.MkdirAll(arts, 0o700); err != nil {
		t.Fatal(err)
	}
	// In the test's own mount namespace (the daemon's private one is a copy
	// of it), so the file system and what a killed daemon left on it outlive
	// each daemon, as a disk does.
	if err := syscall.Mount("tmpfs", arts, "tmpfs", 0, "size=3m,mode=0700"); err != nil {
		citest.SkipOrFail(t, fmt.Sprintf("cannot mount a tmpfs over the artifacts (needs root or CAP_SYS_ADMIN): %v", err))
	}
	t.Cleanup(func() { syscall.Unmount(arts, syscall.MNT_DETACH) })
	env = append(env, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"))
	l := &boundLab{t: t, data: data}
	start := func() {
		t.Helper()
		l.d = startChildWithoutCgroups(t, nil, env...)
		l.c = localclient.New(filepath.Join(data, "control.sock"))
		t.Cleanup(l.c.Close)
		deadline := time.Now().Add(60 * time.Second)
		for {
			if _, err := l.c.Status(t.Context()); err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon does not answer:\n%s", l.d)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	start()
	spools := func() int {
		ents, err := os.ReadDir(filepath.Join(arts, "tmp"))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(arts, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * int64(st.Bsize)
	}

	// No kill: the outcome says why, the spool is gone, the daemon serves.
	sha, serr := l.print(6<<20, "a")
	if sha != "" || !strings.Contains(serr, "no space left on device") {
		t.Fatalf("a 6 MiB artifact on a 3 MiB disk: sha %q, error %q", sha, serr)
	}
	if n := spools(); n != 0 {
		t.Fatalf("%d spools left after the full disk", n)
	}
	sent := 0
	l.send(sent)
	sent++
	if sha, serr := l.print(1<<20, "b"); sha == "" || serr != "" {
		t.Fatalf("a 1 MiB artifact once the failed spool was dropped: sha %q, error %q", sha, serr)
	}

	full, lost := 0, 0
	for i := range rounds {
		execDone := make(chan struct{})
		go func() {
			defer close(execDone)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			code := "import sys\nfor _ in range(96):\n    sys.stdout.write('c' * 65536)\nsys.stdout.flush()\n"
			l.c.Exec(ctx, "default", api.ExecRequest{Code: code, TimeoutSeconds: 120}) // the kill ends it
		}()
		l.send(sent) // acknowledged while the cell spools
		sent++
		deadline := time.Now().Add(60 * time.Second)
		for spools() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no spool in 60s:\n%s", i, l.d)
			}
			time.Sleep(time.Millisecond)
		}
		if i%2 == 0 {
			// The worst instant: the disk is full and the spool still there.
			for free() > 64<<10 && spools() > 0 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Microsecond)
			}
			if spools() > 0 && free() <= 64<<10 {
				full++
			}
		} else {
			time.Sleep(time.Duration(i*7) * time.Millisecond)
		}
		l.d.cmd.Process.Signal(syscall.SIGKILL)
		l.d.wait(t)
		<-execDone
		start()
		if n := spools(); n != 0 {
			t.Fatalf("round %d: %d spools left after the restart", i, n)
		}
		l.send(sent) // the daemon serves
		sent++
		if got := l.count(`SELECT count(*) FROM inbox WHERE session_id = 'default'`); got != int64(sent) {
			t.Fatalf("round %d: %d inputs, %d acknowledged", i, got, sent)
		}
		if got := l.count(`SELECT count(*) FROM executions WHERE state = 'running'`); got != 0 {
			t.Fatalf("round %d: %d cells still running after the restart", i, got)
		}
	}
	// Every cell has an honest outcome: stored, lost by the kill, or not
	// stored because the disk was full.
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(data, store.FileName)+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT e.state, ev.content FROM executions e JOIN events ev ON ev.id = e.outcome_event_id ORDER BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var state, out string
		if err := rows.Scan(&state, &out); err != nil {
			t.Fatal(err)
		}
		n++
		switch {
		case state == "lost" && strings.Contains(out, "klbr-core stopped while this cell ran"):
			lost++
		case state == "ok" && (strings.Contains(out, "no space left on device") || strings.Contains(out, `"artifact"`)):
		default:
			t.Fatalf("cell %d: state %s, outcome %s", n, state, out)
		}
	}
	if n != rounds+2 {
		t.Fatalf("%d cells with an outcome, want %d", n, rounds+2)
	}
	if sha, serr := l.print(1<<20, "d"); sha == "" || serr != "" {
		t.Fatalf("a 1 MiB artifact after the kills: sha %q, error %q", sha, serr)
	}
	t.Logf("%d kills: %d with the disk full and a spool on it; %d cells lost to a kill", rounds, full, lost)
	if full < rounds/4 {
		t.Fatalf("only %d of %d kills landed while the disk was full", full, rounds)
	}
}
