// Command gotest runs `go test -json` with the arguments it is given, prints
// what plain `go test` would (package results, and the output of failing
// tests), and ends with the list of every skipped test and its reason. It
// exits with go test's status. `make gotest` runs it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string `json:"Action"`
	Package string `json:"Package"`
	Test    string `json:"Test"`
	Output  string `json:"Output"`
}

type key struct{ pkg, test string }

// report turns the event stream into plain output and the skipped list.
type report struct {
	out     io.Writer
	output  map[key][]string // a test's output, until it ends
	skipped []skip
	failed  bool
}

type skip struct{ pkg, test, reason string }

func (r *report) event(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "output", "build-output":
		if e.Test == "" {
			if e.Output != "PASS\n" { // -json implies -v, whose PASS line plain go test does not print
				fmt.Fprint(r.out, e.Output) // package results, build errors, panics outside tests
			}
			return
		}
		r.output[k] = append(r.output[k], e.Output)
	case "fail":
		r.failed = true
		if e.Test != "" {
			fmt.Fprint(r.out, strings.Join(r.output[k], ""))
		} else {
			r.unfinished(e.Package)
		}
		delete(r.output, k)
	case "build-fail":
		r.failed = true
	case "skip":
		if e.Test != "" {
			r.skipped = append(r.skipped, skip{e.Package, e.Test, reason(r.output[k])})
		}
		delete(r.output, k)
	case "pass":
		delete(r.output, k)
	}
}

// unfinished prints what the tests of a failed package that never ended
// said: a timeout's panic and goroutine dump, or a crash, go to the tests
// that were running, and no fail event of theirs follows.
func (r *report) unfinished(pkg string) {
	var open []key
	for k := range r.output {
		if k.pkg == pkg && k.test != "" {
			open = append(open, k)
		}
	}
	sort.Slice(open, func(i, j int) bool { return open[i].test < open[j].test })
	for _, k := range open {
		fmt.Fprintf(r.out, "--- unfinished in %s: %s\n%s", pkg, k.test, strings.Join(r.output[k], ""))
		delete(r.output, k)
	}
}

// reason is what a skipped test said: its output without the run and
// result lines.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " / ")
}

func (r *report) summary() {
	if len(r.skipped) == 0 {
		fmt.Fprintln(r.out, "skipped: none")
		return
	}
	sort.Slice(r.skipped, func(i, j int) bool {
		a, b := r.skipped[i], r.skipped[j]
		return a.pkg < b.pkg || a.pkg == b.pkg && a.test < b.test
	})
	fmt.Fprintf(r.out, "skipped: %d tests\n", len(r.skipped))
	for _, s := range r.skipped {
		fmt.Fprintf(r.out, "  %s %s: %s\n", s.pkg, s.test, s.reason)
	}
}

// read feeds every line of in to r; a line that is not an event is printed.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(r.out, sc.Text())
			continue
		}
		r.event(e)
	}
	return sc.Err()
}

func run(args []string) int {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		return 2
	}
	r := &report{out: os.Stdout, output: map[key][]string{}}
	rerr := r.read(stdout)
	werr := cmd.Wait()
	r.summary()
	switch {
	case rerr != nil:
		fmt.Fprintln(os.Stderr, "gotest: reading go test's output:", rerr)
		return 2
	case werr != nil:
		if ee, ok := werr.(*exec.ExitError); ok && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "gotest:", werr)
		return 2
	case r.failed:
		return 1
	}
	return 0
}

func main() { os.Exit(run(os.Args[1:])) }
