package code

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sitter "github.com/tree-sitter/go-tree-sitter"
)

// cpuTime is the process's user+system CPU time: on a shared, loaded
// machine, throughput per CPU second says more than per wall second.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type benchFile struct {
	lang *Language
	src  []byte
}

// repoFiles is every file of this repository a grammar claims, by
// extension, under the bounds code.parse takes (testdata and vendored
// grammar sources left out: they are not the repository's own code).
func repoFiles(b *testing.B) ([]benchFile, int64) {
	var out []benchFile
	var total int64
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "grammar", "node_modules", "__pycache__":
				return filepath.SkipDir
			}
			return nil
		}
		l, how := Detect(p, nil)
		if l == nil || !strings.HasPrefix(how, "extension") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil || len(src) > MaxSourceBytes {
			return nil
		}
		out = append(out, benchFile{l, src})
		total += int64(len(src))
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return out, total
}

// vmKB reads a field of /proc/self/status (VmHWM: peak resident set).
func vmKB(field string) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			n, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return n
		}
	}
	return 0
}

// BenchmarkRepoTree parses every source file of this repository, alone
// and with its language's symbols query (what code.open asks the host):
// files/s and MB/s, and the process's peak RSS (tree-sitter allocates in
// C, outside Go's allocation counts).
func BenchmarkRepoTree(b *testing.B) {
	files, total := repoFiles(b)
	var c cache
	queries := map[string]*Query{}
	for _, l := range Languages() {
		q, err := c.load(os.DirFS("../../behavior"), "bench", l, "symbols")
		if err != nil {
			b.Fatal(err)
		}
		queries[l.Name] = q
	}
	langs := map[string]int{}
	for _, f := range files {
		langs[f.lang.Name]++
	}
	b.Logf("%d files, %.2f MB: %v", len(files), float64(total)/1e6, langs)
	for _, withQuery := range []bool{false, true} {
		name := "parse"
		if withQuery {
			name = "parse+symbols"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(total)
			b.ReportAllocs()
			rss0 := vmKB("VmRSS")
			cpu0 := cpuTime()
			symbols := 0
			for b.Loop() {
				symbols = 0
				for _, f := range files {
					var qs []*Query
					if withQuery {
						qs = []*Query{queries[f.lang.Name]}
					}
					res, err := Parse(context.Background(), f.lang, f.src, qs)
					if err != nil {
						b.Fatal(err)
					}
					for _, q := range res.Queries {
						symbols += len(q.Matches)
					}
				}
			}
			cpu := (cpuTime() - cpu0).Seconds()
			b.ReportMetric(float64(len(files))*float64(b.N)/b.Elapsed().Seconds(), "files/s")
			b.ReportMetric(float64(len(files))*float64(b.N)/cpu, "files/cpu-s")
			b.ReportMetric(float64(total)*float64(b.N)/cpu/1e6, "MB/cpu-s")
			b.ReportMetric(float64(symbols), "matches")
			b.ReportMetric(vmKB("VmHWM")/1024, "peak-RSS-MB")
			b.ReportMetric((vmKB("VmRSS")-rss0)/1024, "RSS-growth-MB")
		})
	}
}

// big10k is a 10,000-line Python file of 1000 classes and functions (the
// file BenchmarkCodeOpen10kLines opens from a cell).
func big10k() []byte {
	var b strings.Builder
	for i := range 1000 {
		n := strconv.Itoa(i)
		b.WriteString("class C" + n + ":\n    \"\"\"Doc " + n + ".\"\"\"\n\n    def m" + n + "(self, x):\n        y = x * " + n +
			"\n        return y + 1\n\ndef f" + n + "(a, b):\n    return C" + n + "().m" + n + "(a) - b\n\n")
	}
	return []byte(b.String())
}

// BenchmarkParse10kLines compares go-tree-sitter's Parse (every read of the
// lexer copies the rest of the source into C memory) with Parse here
// (16 KiB chunks), side by side, on the 10,000-line file.
func BenchmarkParse10kLines(b *testing.B) {
	src := big10k()
	l, _ := Lookup("python")
	b.Run("go-tree-sitter-Parse", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			p := sitter.NewParser()
			p.SetLanguage(l.ts)
			p.Parse(src, nil).Close()
			p.Close()
		}
	})
	b.Run("chunked", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			if _, err := Parse(context.Background(), l, src, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHostileParse reports the C heap one parse of 760 KB of dense
// brackets holds at its peak: unbounded (go-tree-sitter's parser, as
// code.parse ran it before issue 27; its allocations counted with no limit)
// against Parse with its bounds, side by side.
func BenchmarkHostileParse(b *testing.B) {
	src := []byte(hostileSource("python", "dense"))
	l, _ := Lookup("python")
	b.Run("unbounded", func(b *testing.B) {
		var peak int64
		for b.Loop() {
			h := newHeap(1 << 62)
			h.begin()
			p := sitter.NewParser()
			p.SetLanguage(l.ts)
			tree := p.Parse(src, nil)
			h.end()
			peak = max(peak, h.peak())
			tree.Close()
			p.Close()
			h.free()
			trimHeap()
		}
		b.ReportMetric(float64(peak)/(1<<20), "C-heap-peak-MiB")
	})
	b.Run("bounded", func(b *testing.B) {
		var peak int64
		for b.Loop() {
			_, err := Parse(context.Background(), l, src, nil)
			var le *LimitError
			if !errors.As(err, &le) {
				b.Fatalf("760 KB of dense brackets: %v", err)
			}
			peak = max(peak, le.heapPeak)
		}
		b.ReportMetric(float64(peak)/(1<<20), "C-heap-peak-MiB")
	})
}
