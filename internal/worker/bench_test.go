package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/python"
)

// BenchmarkWorkbench compares the klbr workbench with Jupyter's ipykernel
// (driven by jupyter_client) on the same machine and the same interpreter
// binary, /usr/bin/python3 with its symlinks resolved (docs/performance.md):
//
//	go test -run='^$' -bench=BenchmarkWorkbench -benchtime=200x -count=1 ./internal/worker/
//
// op=roundtrip is one `x = 1` cell (execute sent → outcome received), b.N
// times on one worker; op=coldstart is spawn → ready for the first cell (and
// → the first cell done), at most coldstartCap times per run. The ipykernel
// side runs testdata/ipykernel_bench.py, which needs the Debian packages
// python3-ipykernel and python3-jupyter-client; without them those
// sub-benchmarks are skipped (and fail when CI=true). ns/op is replaced by the
// mean of the samples actually taken.
func BenchmarkWorkbench(b *testing.B) {
	benchSetup(b)
	b.Run("impl=klbr/op=roundtrip", benchKlbrRoundtrip)
	b.Run("impl=klbr/op=coldstart", benchKlbrColdstart)
	b.Run("impl=klbr/op=output", func(b *testing.B) { benchKlbrOutput(b, false) })
	b.Run("impl=klbr/op=output-bulk", func(b *testing.B) { benchKlbrOutput(b, true) })
	b.Run("impl=klbr/op=idle-rss", benchKlbrIdleRSS)
	for _, client := range []string{"blocking", "raw"} {
		impl := "ipykernel"
		if client == "raw" {
			impl = "ipykernel-raw"
		}
		b.Run("impl="+impl+"/op=roundtrip", func(b *testing.B) { benchIPyRoundtrip(b, client) })
		b.Run("impl="+impl+"/op=coldstart", func(b *testing.B) { benchIPyColdstart(b, client) })
	}
	b.Run("impl=ipykernel/op=idle-rss", benchIPyIdleRSS)
}

const (
	benchPython   = "/usr/bin/python3"
	coldstartCap  = 20 // cold starts per run: each takes a few hundred ms
	outputCap     = 3  // ~50 MB cells per run
	outputLines   = 500_000
	outputLineLen = 100 // characters per line, plus the newline
)

// bench is shared by the sub-benchmarks of one BenchmarkWorkbench call: the
// kernel binary, the materialized runtime, the interpreter and the placer.
var bench struct {
	dir     string
	kernel  string
	runtime string
	python  string
	placer  placement.Placer
	ipyErr  error // why ipykernel cannot be driven here, or nil
	ipyDir  string
	gen     atomic.Int64
}

func benchSetup(b *testing.B) {
	b.Helper()
	dir, err := os.MkdirTemp("", "klbr-worker-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	bench.dir = dir
	if bench.python, err = filepath.EvalSymlinks(benchPython); err != nil {
		b.Fatalf("interpreter %s: %v", benchPython, err)
	}
	bench.kernel = filepath.Join(dir, "klbr-kernel")
	if out, err := exec.Command("go", "build", "-o", bench.kernel, "../../cmd/klbr-kernel").CombinedOutput(); err != nil {
		b.Fatalf("build klbr-kernel: %v: %s", err, out)
	}
	if bench.runtime, _, err = python.Materialize(filepath.Join(dir, "runtime")); err != nil {
		b.Fatal(err)
	}
	if bench.placer, err = placement.Detect(context.Background(), placement.Options{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bench.placer.Close() })
	bench.ipyErr = nil
	if out, err := exec.Command(bench.python, "-c", "import ipykernel, jupyter_client").CombinedOutput(); err != nil {
		bench.ipyErr = fmt.Errorf("%s cannot import ipykernel and jupyter_client (%v: %s); install the Debian packages python3-ipykernel and python3-jupyter-client",
			bench.python, err, strings.TrimSpace(string(out)))
	}
	// IPython's profile and history: private to the benchmark, shared by its runs.
	bench.ipyDir = filepath.Join(dir, "ipython")
}

// benchSpec is a workbench spec with a new generation, a temp workspace and
// an artifact store on the real disk.
func benchSpec(b *testing.B) Spec {
	b.Helper()
	store, err := artifacts.New(filepath.Join(b.TempDir(), "artifacts"))
	if err != nil {
		b.Fatal(err)
	}
	return Spec{
		Role: RoleWorkbench, Session: "bench", Generation: bench.gen.Add(1),
		Kernel: bench.kernel, Python: bench.python, RuntimeSrc: bench.runtime, Workspace: b.TempDir(),
		Placer: bench.placer, Artifacts: store,
	}
}

func benchStart(b *testing.B) *Worker {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := Start(ctx, benchSpec(b))
	if err != nil {
		b.Fatalf("Start: %v", err)
	}
	b.Cleanup(w.Kill)
	return w
}

func benchCell(b *testing.B, w *Worker, id, code string) *Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o, err := w.Execute(ctx, id, code, nil)
	if err != nil {
		b.Fatalf("Execute %s: %v", id, err)
	}
	if o.Status != "ok" {
		b.Fatalf("cell %s: %s %+v (diagnostics: %s)", id, o.Status, o.Error, w.Diagnostics())
	}
	return o
}

func benchKlbrRoundtrip(b *testing.B) {
	w := benchStart(b)
	for i := range 20 {
		benchCell(b, w, "warm"+strconv.Itoa(i), "x = 1")
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "e" + strconv.Itoa(i)
	}
	samples := make([]float64, b.N)
	b.ResetTimer()
	for i := range b.N {
		t := time.Now()
		benchCell(b, w, ids[i], "x = 1")
		samples[i] = float64(time.Since(t).Nanoseconds()) / 1e3
	}
	b.StopTimer()
	b.ReportMetric(median(samples), "p50-us")
	b.ReportMetric(percentile(samples, 0.99), "p99-us")
}

func benchKlbrColdstart(b *testing.B) {
	once := func(i int) (ready, first time.Duration) {
		spec := benchSpec(b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t := time.Now()
		w, err := Start(ctx, spec)
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		ready = time.Since(t)
		benchCell(b, w, "c"+strconv.Itoa(i), "x = 1")
		first = time.Since(t)
		w.Kill()
		return ready, first
	}
	once(-1) // warm-up, like the ipykernel side's
	n := min(b.N, coldstartCap)
	ready, first := make([]float64, n), make([]float64, n)
	b.ResetTimer()
	for i := range n {
		r, f := once(i)
		ready[i], first[i] = ms(r), ms(f)
	}
	b.StopTimer()
	b.ReportMetric(mean(ready)*1e6, "ns/op")
	b.ReportMetric(median(ready), "p50-ms")
	b.ReportMetric(median(first), "first-cell-ms")
}

// benchKlbrOutput runs cells that print ~50 MB: op=output as one print()
// per 101-byte line (two writes each), op=output-bulk as 50 writes of ~1 MB,
// which leaves out the per-write cost of the captured sys.stdout and so shows
// what the transport and the spool alone sustain.
func benchKlbrOutput(b *testing.B, bulk bool) {
	w := benchStart(b)
	line := strings.Repeat("x", outputLineLen)
	code := fmt.Sprintf("for _ in range(%d):\n    print(%q)", outputLines, line)
	if bulk {
		const writes = 50
		code = fmt.Sprintf("import sys\nchunk = (%q + '\\n') * %d\nfor _ in range(%d):\n    sys.stdout.write(chunk)", line, outputLines/writes, writes)
	}
	want := int64(outputLines * (outputLineLen + 1))
	benchCell(b, w, "warm", "print('x')")
	n := min(b.N, outputCap)
	var total int64
	var elapsed time.Duration
	b.ResetTimer()
	for i := range n {
		t := time.Now()
		o := benchCell(b, w, "o"+strconv.Itoa(i), code)
		elapsed += time.Since(t)
		b.StopTimer()
		out := o.Output
		switch {
		case out.TotalBytes != want:
			b.Fatalf("output of %d bytes, want %d", out.TotalBytes, want)
		case out.SpoolError != "":
			b.Fatalf("spool: %s", out.SpoolError)
		case out.Artifact == nil:
			b.Fatalf("no artifact for %d bytes of output", out.TotalBytes)
		}
		p, err := w.spec.Artifacts.Path(out.Artifact.SHA256)
		if err != nil {
			b.Fatal(err)
		}
		if fi, err := os.Stat(p); err != nil || fi.Size() != want {
			b.Fatalf("artifact %s: %v, %v bytes, want %d", p, err, fi, want)
		}
		total += out.TotalBytes
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n), "ns/op")
	b.ReportMetric(float64(total)/1e6/elapsed.Seconds(), "MB/s")
}

func benchKlbrIdleRSS(b *testing.B) {
	w := benchStart(b)
	benchCell(b, w, "one", "x = 1")
	time.Sleep(500 * time.Millisecond) // the same settling time as the ipykernel side
	if b.N > 1 {
		h := w.Hello()
		b.Logf("klbr workbench on %s (Python %s, runtime sdk %s); placement %s; artifacts under %s (%s)",
			bench.python, h.Python, h.SDK, bench.placer.Mode(), os.TempDir(), fsType(os.TempDir()))
	}
	b.ResetTimer()
	var py, kern float64
	for range b.N {
		py = rssMB(b, w.Hello().PID)
		kern = rssMB(b, w.cmd.Process.Pid)
	}
	b.ReportMetric(py, "python-rss-MB")
	b.ReportMetric(kern, "kernel-rss-MB")
}

// ipyResult is what testdata/ipykernel_bench.py prints.
type ipyResult struct {
	Python      string            `json:"python"`
	Versions    map[string]string `json:"versions"`
	SamplesUS   []float64         `json:"samples_us"`
	ReadyMS     []float64         `json:"ready_ms"`
	FirstCellMS []float64         `json:"first_cell_ms"`
	PythonRSSMB float64           `json:"python_rss_mb"`
}

func runIPy(b *testing.B, mode, client string, n int) ipyResult {
	b.Helper()
	if bench.ipyErr != nil {
		if os.Getenv("CI") == "true" {
			b.Fatal(bench.ipyErr)
		}
		b.Skip(bench.ipyErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bench.python, "testdata/ipykernel_bench.py",
		"--mode", mode, "--client", client, "--n", strconv.Itoa(n), "--python", bench.python)
	cmd.Env = append(os.Environ(), "IPYTHONDIR="+bench.ipyDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("ipykernel_bench.py --mode %s --client %s: %v\n%s", mode, client, err, stderr.String())
	}
	var r ipyResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		b.Fatalf("ipykernel_bench.py output: %v: %q\n%s", err, stdout.String(), stderr.String())
	}
	if r.Python != bench.python {
		b.Fatalf("ipykernel ran on %s, want %s", r.Python, bench.python)
	}
	return r
}

func benchIPyRoundtrip(b *testing.B, client string) {
	r := runIPy(b, "roundtrip", client, b.N)
	if len(r.SamplesUS) != b.N {
		b.Fatalf("%d samples, want %d", len(r.SamplesUS), b.N)
	}
	b.ReportMetric(mean(r.SamplesUS)*1e3, "ns/op")
	b.ReportMetric(median(r.SamplesUS), "p50-us")
	b.ReportMetric(percentile(r.SamplesUS, 0.99), "p99-us")
}

func benchIPyColdstart(b *testing.B, client string) {
	n := min(b.N, coldstartCap)
	r := runIPy(b, "coldstart", client, n)
	if len(r.ReadyMS) != n || len(r.FirstCellMS) != n {
		b.Fatalf("%d/%d samples, want %d", len(r.ReadyMS), len(r.FirstCellMS), n)
	}
	b.ReportMetric(mean(r.ReadyMS)*1e6, "ns/op")
	b.ReportMetric(median(r.ReadyMS), "p50-ms")
	b.ReportMetric(median(r.FirstCellMS), "first-cell-ms")
}

func benchIPyIdleRSS(b *testing.B) {
	r := runIPy(b, "idle-rss", "blocking", 1)
	if b.N > 1 {
		b.Logf("ipykernel %s, jupyter_client %s, pyzmq %s on Python %s (%s)",
			r.Versions["ipykernel"], r.Versions["jupyter_client"], r.Versions["pyzmq"], r.Versions["python"], r.Python)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.PythonRSSMB, "python-rss-MB")
}

// rssMB is the resident set of pid in MB (MiB), from /proc/PID/status.
func rssMB(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatalf("VmRSS of %d: %q", pid, line)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no VmRSS for %d", pid)
	return 0
}

// fsType names the file system dir is on, for the log.
func fsType(dir string) string {
	out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE", "--target", dir).Output()
	if err != nil {
		return "unknown file system"
	}
	return strings.TrimSpace(string(out))
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// median is the middle sample, or the mean of the two middle ones (as
// Python's statistics.median).
func median(xs []float64) float64 {
	s := sorted(xs)
	n := len(s)
	switch {
	case n == 0:
		return math.NaN()
	case n%2 == 1:
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile is the sample at rank floor(n·p) (0-based), as the Python side.
func percentile(xs []float64, p float64) float64 {
	s := sorted(xs)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func sorted(xs []float64) []float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s
}
