package code

import (
	"bufio"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

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
			b.ReportMetric(float64(len(files))*float64(b.N)/b.Elapsed().Seconds(), "files/s")
			b.ReportMetric(float64(symbols), "matches")
			b.ReportMetric(vmKB("VmHWM")/1024, "peak-RSS-MB")
			b.ReportMetric((vmKB("VmRSS")-rss0)/1024, "RSS-growth-MB")
		})
	}
}
