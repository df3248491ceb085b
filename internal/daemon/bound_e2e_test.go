package daemon

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

// boundLab is a daemon whose data directory is bounded by [storage].
type boundLab struct {
	t    *testing.T
	data string
	c    *localclient.Client
	d    *child
}

func startBounded(t *testing.T, toml string) *boundLab {
	t.Helper()
	requirePython(t)
	data, env := instance(t)
	if err := os.WriteFile(filepath.Join(data, "klbr.toml"), []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"))
	l := &boundLab{t: t, data: data, d: startChildWithoutCgroups(t, nil, env...)}
	l.c = localclient.New(filepath.Join(data, "control.sock"))
	t.Cleanup(l.c.Close)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := l.c.Status(t.Context()); err == nil {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not answer:\n%s", l.d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// print runs a cell that prints n bytes (past the preview: an artifact).
func (l *boundLab) print(n int, fill string) (sha, spoolErr string) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(l.t.Context(), 3*time.Minute)
	defer cancel()
	code := fmt.Sprintf("import sys\nfor _ in range(%d):\n    sys.stdout.write(%q * 65536)\nsys.stdout.flush()\n", n/65536, fill)
	res, err := l.c.Exec(ctx, "default", api.ExecRequest{Code: code, TimeoutSeconds: 120})
	if err != nil {
		l.l()
		l.t.Fatal(err)
	}
	o := res.Outcome.Output
	if o.Artifact != nil {
		sha = o.Artifact.SHA256
	}
	return sha, o.SpoolError
}

func (l *boundLab) l() { l.t.Logf("daemon log:\n%s", l.d) }

func (l *boundLab) send(i int) {
	l.t.Helper()
	if _, err := l.c.Send(l.t.Context(), "default", api.SendRequest{Text: fmt.Sprintf("input %d", i), SourceKey: fmt.Sprintf("bound-%d", i)}); err != nil {
		l.t.Fatalf("input %d not admitted: %v", i, err)
	}
}

func (l *boundLab) count(q string) int64 {
	l.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(l.data, store.FileName)+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		l.t.Fatal(err)
	}
	defer db.Close()
	var n int64
	if err := db.QueryRow(q).Scan(&n); err != nil {
		l.t.Fatal(err)
	}
	return n
}

// At its bound the daemon refuses a large artifact with an error the cell's
// outcome carries, keeps admitting inputs, and status says so; online gc
// (through the operator API, while the daemon serves) frees the old
// artifacts retention allows and never an original record.
func TestStorageBoundRefusesArtifactsAdmitsInputs(t *testing.T) {
	l := startBounded(t, "[storage]\nmax_bytes = 16777216\nwarn_at = 0.95\n\n[retention]\nartifact_days = 1\n")

	old, serr := l.print(6<<20, "a")
	if old == "" || serr != "" {
		t.Fatalf("a 6 MiB artifact under a 16 MiB bound: sha %q, error %q", old, serr)
	}
	l.send(0)
	// Passing the bound: the artifact is refused, the cell sees why.
	sha, serr := l.print(12<<20, "b")
	if sha != "" || !strings.Contains(serr, "max_bytes") || !strings.Contains(serr, "inputs are still admitted") {
		t.Fatalf("a 12 MiB artifact past the bound: sha %q, error %q", sha, serr)
	}
	for i := 1; i <= 50; i++ {
		l.send(i)
	}
	if left, _ := os.ReadDir(filepath.Join(l.data, "artifacts", "tmp")); len(left) != 0 {
		t.Fatalf("the refused spool is left: %v", left)
	}
	st, err := l.c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Usage.Max != 16<<20 || st.Usage.Used < 6<<20 || st.Usage.Headroom != st.Usage.Max-st.Usage.Used {
		t.Fatalf("status usage %+v", st.Usage)
	}
	inputs := l.count(`SELECT count(*) FROM inbox WHERE session_id = 'default'`)
	if inputs != 51 {
		t.Fatalf("inputs admitted: %d, want 51", inputs)
	}
	events := l.count(`SELECT count(*) FROM events`)

	// Nothing is past retention yet: gc removes nothing.
	res, err := l.c.GC(t.Context())
	if err != nil || len(res.Removed) != 0 {
		t.Fatalf("gc with nothing old: %+v, %v", res, err)
	}
	// The first artifact ages past artifact_days.
	p := filepath.Join(l.data, "artifacts", "sha256", old)
	past := time.Now().Add(-72 * time.Hour)
	os.Chtimes(p, past, past)
	rw, err := sql.Open("sqlite3", "file:"+filepath.Join(l.data, store.FileName)+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(`UPDATE artifacts SET created_at = ? WHERE sha256 = ?`, past.UnixMilli(), old); err != nil {
		t.Fatal(err)
	}
	rw.Close()
	res, err = l.c.GC(t.Context())
	if err != nil || len(res.Removed) != 1 || res.Removed[0].Ref != old || res.Bytes != 6<<20 {
		t.Fatalf("online gc: %+v, %v", res, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("the collected artifact is still there: %v", err)
	}
	if n := l.count(`SELECT count(*) FROM tombstones WHERE kind = 'artifact' AND ref = '` + old + `'`); n != 1 {
		t.Fatalf("tombstones of the collected artifact: %d", n)
	}
	if n := l.count(`SELECT count(*) FROM events`); n < events {
		t.Fatalf("gc removed original records: %d before, %d after", events, n)
	}
	after, _ := l.c.Status(t.Context())
	// The meter counts what gc freed: it agrees with a measurement again.
	sz := after.Sizes
	if measured := sz.Database + sz.WAL + sz.Artifacts + sz.Releases; sz.Artifacts > st.Sizes.Artifacts-(5<<20) ||
		after.Usage.Used < measured-(1<<20) || after.Usage.Used > measured+(1<<20) {
		t.Fatalf("after gc: usage %+v, sizes %+v (before: %+v)", after.Usage, sz, st.Sizes)
	}
	// With the room gc made, the large artifact is stored.
	if sha, serr := l.print(8<<20, "c"); sha == "" || serr != "" {
		t.Fatalf("after gc: sha %q, error %q", sha, serr)
	}
	l.send(51)
}
