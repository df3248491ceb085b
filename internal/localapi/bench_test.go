package localapi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// BenchmarkAdmission measures admission with synchronous=FULL: inputs/s and
// p50/p99 acknowledgement latency at 1, 16 and 64 concurrent submitters, in
// four modes, all on the same disk:
//
//   - inproc: Admitter.Admit called directly, the store's group commit as in
//     production (MaxBatch 0, i.e. 256);
//   - socket: the operator API on a real control socket, each submitter using
//     its own localclient.Client;
//   - tx-per-input: baseline (a), inproc with MaxBatch 1, so one transaction
//     and one fsync per input through the same writer path;
//   - fsync: baseline (b), the raw rate of write(64 bytes)+fsync on one file
//     shared by all submitters.
//
// Besides ns/op each reports inputs/s (operations over the timed wall
// time), p50-ms and p99-ms (nearest-rank, over every operation of the final
// run) and, for the three admission modes, inputs/commit: how many inputs
// shared one transaction, and so one fsync, on average.
//
// The base directory is KLBR_BENCH_DIR if set, else the system temp
// directory; if that is a tmpfs (which has no fsync cost) it falls back to
// one under the package directory, on the project's disk. See
// docs/performance.md for the figures and how to read them.
//
//	go test -run='^$' -bench=BenchmarkAdmission -benchtime=2s -count=3 ./internal/localapi/
func BenchmarkAdmission(b *testing.B) {
	base, fsName, cleanup := benchBaseDir(b)
	defer cleanup()
	// The parent's log is shown only with -v; a leaf's always, so the first
	// leaf tells, once.
	logged := false

	modes := []struct {
		name string
		run  func(b *testing.B, dir string, submitters int)
	}{
		{"inproc", func(b *testing.B, dir string, n int) { benchInproc(b, dir, n, 0) }},
		{"socket", benchSocket},
		{"tx-per-input", func(b *testing.B, dir string, n int) { benchInproc(b, dir, n, 1) }},
		{"fsync", benchFsync},
	}
	for _, submitters := range []int{1, 16, 64} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("mode=%s/submitters=%d", m.name, submitters), func(b *testing.B) {
				dir, err := os.MkdirTemp(base, "run-")
				if err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(dir)
				if !logged {
					logged = true
					b.Logf("data under %s (filesystem %s), GOMAXPROCS %d", base, fsName, runtime.GOMAXPROCS(0))
				}
				m.run(b, dir, submitters)
			})
		}
	}
}

// benchBaseDir picks the directory every mode works under, refusing tmpfs.
func benchBaseDir(b *testing.B) (dir, fsName string, cleanup func()) {
	parent := os.Getenv("KLBR_BENCH_DIR")
	if parent == "" {
		parent = os.TempDir()
	}
	if name, tmpfs := fsType(b, parent); tmpfs {
		wd, err := os.Getwd()
		if err != nil {
			b.Fatal(err)
		}
		if _, tmpfs := fsType(b, wd); tmpfs {
			b.Fatalf("both %s (%s) and %s are tmpfs; set KLBR_BENCH_DIR to a directory on a real disk", parent, name, wd)
		}
		parent = wd
	}
	dir, err := os.MkdirTemp(parent, ".klbr-bench-")
	if err != nil {
		b.Fatal(err)
	}
	name, _ := fsType(b, dir)
	return dir, name, func() { os.RemoveAll(dir) }
}

// fsType names the filesystem dir is on, and says whether it is a tmpfs.
func fsType(b *testing.B, dir string) (name string, tmpfs bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		b.Fatalf("statfs %s: %v", dir, err)
	}
	names := map[int64]string{
		unix.EXT4_SUPER_MAGIC:      "ext2/3/4",
		unix.XFS_SUPER_MAGIC:       "xfs",
		unix.BTRFS_SUPER_MAGIC:     "btrfs",
		unix.TMPFS_MAGIC:           "tmpfs",
		unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
		unix.F2FS_SUPER_MAGIC:      "f2fs",
		0x2fc12fc1:                 "zfs",
	}
	t := int64(st.Type)
	name, ok := names[t]
	if !ok {
		name = fmt.Sprintf("statfs type %#x", t)
	}
	return name, t == unix.TMPFS_MAGIC || t == unix.RAMFS_MAGIC
}

// benchAdmitter opens a store in dir with the default session and returns an
// Admitter over it.
func benchAdmitter(b *testing.B, dir string, maxBatch int) (*store.Store, *session.Manager, *admission.Admitter) {
	ctx := context.Background()
	st, err := store.Open(ctx, dir, store.Options{MaxBatch: maxBatch})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.EnsureSession(session.DefaultID)
		return err
	}); err != nil {
		st.Close()
		b.Fatal(err)
	}
	sessions := session.NewManager(st)
	return st, sessions, admission.New(st, sessions, nil, nil)
}

func benchInproc(b *testing.B, dir string, submitters, maxBatch int) {
	st, _, adm := benchAdmitter(b, dir, maxBatch)
	defer st.Close()
	defer adm.Close(context.Background())
	ctx := context.Background()
	defer reportBatches(b, st)()
	runSubmitters(b, submitters, func(int) func(i int) error {
		return func(i int) error {
			_, err := adm.Admit(ctx, admission.DoorOperatorAPI, admission.Input{
				Session: session.DefaultID, SourceKind: admission.SourceOperator,
				SourceKey: benchKey(i), Conversation: "operator", Author: "operator",
				Body: "benchmark input",
			})
			return err
		}
	})
}

func benchSocket(b *testing.B, dir string, submitters int) {
	st, sessions, adm := benchAdmitter(b, dir, 0)
	defer st.Close()
	defer adm.Close(context.Background())

	path := filepath.Join(dir, "control.sock")
	ln, err := unixsock.Listen(path, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	srv := localapi.New(st, adm, sessions, benchDaemon{}, logger).HTTPServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			b.Error(err)
		}
	}()

	clients := make([]*localclient.Client, submitters)
	for w := range clients {
		clients[w] = localclient.New(path)
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	ctx := context.Background()
	defer reportBatches(b, st)()
	runSubmitters(b, submitters, func(w int) func(i int) error {
		c := clients[w]
		return func(i int) error {
			_, err := c.Send(ctx, session.DefaultID, api.SendRequest{Text: "benchmark input", SourceKey: benchKey(i)})
			return err
		}
	})
}

func benchFsync(b *testing.B, dir string, submitters int) {
	f, err := os.OpenFile(filepath.Join(dir, "fsync.dat"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rec := make([]byte, 64)
	for i := range rec {
		rec[i] = 'x'
	}
	rec[len(rec)-1] = '\n'
	runSubmitters(b, submitters, func(int) func(int) error {
		return func(int) error {
			if _, err := f.Write(rec); err != nil {
				return err
			}
			return f.Sync()
		}
	})
}

// reportBatches reports how many inputs shared one transaction (and so one
// fsync) on average, from now until the returned function is called.
func reportBatches(b *testing.B, st *store.Store) func() {
	before := st.Stats()
	return func() {
		if b.Failed() {
			return
		}
		after := st.Stats()
		if n := after.Batches - before.Batches; n > 0 {
			b.ReportMetric(float64(after.Writes-before.Writes)/float64(n), "inputs/commit")
		}
	}
}

func benchKey(i int) string { return fmt.Sprintf("bench-%d", i) }

// runSubmitters runs b.N operations spread over submitters goroutines, each
// taking the next index from a shared counter, and reports inputs/s and the
// p50 and p99 latency of one operation. newOp is called once per submitter,
// before the timer starts.
func runSubmitters(b *testing.B, submitters int, newOp func(submitter int) func(i int) error) {
	ops := make([]func(int) error, submitters)
	for w := range ops {
		ops[w] = newOp(w)
	}
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup

	b.ResetTimer()
	start := time.Now()
	for w := range submitters {
		op := ops[w]
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					if !failed.Swap(true) {
						b.Errorf("op %d: %v", i, err)
					}
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed.Load() {
		return
	}

	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "inputs/s")
	b.ReportMetric(ms(percentile(lat, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(lat, 99)), "p99-ms")
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchDaemon is the least a localapi.Server needs of its daemon.
type benchDaemon struct{}

func (benchDaemon) Status(context.Context) (api.Status, error) { return api.Status{}, nil }
func (benchDaemon) Shutdown(bool)                              {}
func (benchDaemon) Closing() <-chan struct{}                   { return nil }
