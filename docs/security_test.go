// Package docs_test checks that docs/security.md's list of host operations
// on what a cell controls is proven: every test a row names exists.
package docs_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// proof is one test a row of the list names.
type proof struct {
	row  string // the row's first cell, for messages
	name string // as written: pkg.TestName or py:file::Class
}

// proofRef matches the proofs in a row's last cell.
var proofRef = regexp.MustCompile("`((?:(?:internal|cmd|nix|python|behavior)/[A-Za-z0-9_/-]+|nix)\\.(?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+|py:[A-Za-z0-9_./-]+::[A-Za-z0-9_]+)`")

// rows reads the table under "## Every host operation on what a cell
// controls" and returns each row's proofs.
func rows(t *testing.T) map[string][]proof {
	t.Helper()
	f, err := os.Open("security.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]proof{}
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## Every host operation")
			continue
		}
		if !in || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| host operation") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 4 {
			t.Errorf("security.md: a row of the list has %d cells, want 4: %s", len(cells), line)
			continue
		}
		op := strings.TrimSpace(cells[0])
		for _, m := range proofRef.FindAllStringSubmatch(cells[3], -1) {
			out[op] = append(out[op], proof{row: op, name: m[1]})
		}
		if len(out[op]) == 0 {
			t.Errorf("security.md: %q names no test that proves it", op)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// goTests returns the names of the test, fuzz and benchmark functions
// declared in dir's _test.go files.
func goTests(t *testing.T, dir string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	fset := token.NewFileSet()
	for _, p := range files {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				names[fd.Name.Name] = true
			}
		}
	}
	return names
}

// TestSecurityListIsProven walks docs/security.md's list: every row names a
// test, and every test it names exists where it says.
func TestSecurityListIsProven(t *testing.T) {
	list := rows(t)
	if len(list) < 10 {
		t.Fatalf("security.md lists %d host operations; the list was not found or lost rows", len(list))
	}
	tests := map[string]map[string]bool{}
	for _, proofs := range list {
		for _, p := range proofs {
			if file, class, ok := strings.Cut(strings.TrimPrefix(p.name, "py:"), "::"); strings.HasPrefix(p.name, "py:") && ok {
				b, err := os.ReadFile(filepath.Join("..", file))
				if err != nil || !regexp.MustCompile(`(?m)^class `+regexp.QuoteMeta(class)+`\b`).Match(b) {
					t.Errorf("%s: %s names a Python test that does not exist", p.row, p.name)
				}
				continue
			}
			i := strings.LastIndex(p.name, ".")
			dir, fn := p.name[:i], p.name[i+1:]
			if tests[dir] == nil {
				tests[dir] = goTests(t, filepath.Join("..", dir))
			}
			if !tests[dir][fn] {
				t.Errorf("%s: %s names a test that does not exist", p.row, p.name)
			}
		}
	}
}
