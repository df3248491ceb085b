package code

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/klbr-dev/klbr/internal/worker"
)

// hostileSource is about 760 KB of brackets in lang: nested ("nested"),
// opened and never closed ("open"), or flat but densely packed ("dense":
// [[],[],...], which costs tree-sitter as much memory as nesting does).
func hostileSource(lang, shape string) string {
	const n = 380 << 10
	prefix := map[string]string{"python": "x = ", "go": "package p\nvar x = ", "javascript": "x = ", "typescript": "let x = ",
		"tsx": "let x = ", "rust": "fn f() { let x = ", "nix": "", "bash": "echo "}[lang]
	switch shape {
	case "nested":
		return prefix + strings.Repeat("[", n) + strings.Repeat("]", n)
	case "open":
		return prefix + strings.Repeat("(", 2*n)
	default:
		return prefix + "[" + strings.Repeat("[],", 2*n/3) + "]"
	}
}

// hostileRequests are 16 code.parse requests as code.open sends them
// (with the symbols query), in every language, each shape.
func hostileRequests() []map[string]any {
	var out []map[string]any
	shapes := []string{"nested", "dense", "open"}
	var langs []string // those with a grammar: a text-only one parses nothing
	for _, l := range Languages() {
		if !l.TextOnly {
			langs = append(langs, l.Name)
		}
	}
	for i := 0; len(out) < 16; i++ {
		lang := langs[i%len(langs)]
		out = append(out, map[string]any{"language": lang, "text": hostileSource(lang, shapes[i%len(shapes)]), "queries": []string{"symbols"}})
	}
	return out
}

// rssKB is the process's resident set now (VmRSS), with the C heap
// tree-sitter allocates outside Go's counts; peak is VmHWM.
func rssKB() (now, peak float64) { return vmKB("VmRSS"), vmKB("VmHWM") }

const hostileChildEnv = "KLBR_CODE_HOSTILE_CHILD"

// TestHostileParsesChild runs 16 hostile code.parse requests at once
// through Ops (the entry point of code.open, src.query, code.references and
// the re-parse after replace_*) in a process of its own, and prints its
// memory: baseline, peak, and after.
func TestHostileParsesChild(t *testing.T) {
	if os.Getenv(hostileChildEnv) == "" {
		t.Skip("the child of TestSixteenHostileParsesAreBounded")
	}
	reqs := hostileRequests()
	raws := make([]json.RawMessage, len(reqs))
	for i, r := range reqs {
		raws[i], _ = json.Marshal(r)
	}
	o := NewOps(nil, behaviorTree)
	// Warm up: grammars, the symbols queries, the Go runtime's threads.
	for _, l := range Languages() {
		raw, _ := json.Marshal(map[string]any{"language": l.Name, "text": "x", "queries": []string{"symbols"}})
		o.HandleRequest(context.Background(), worker.Request{Op: "code.parse", Args: raw})
	}
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, _ := rssKB()
	goBase := ms.HeapInuse
	var wg sync.WaitGroup
	outcomes := make([]string, len(reqs))
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := o.HandleRequest(context.Background(), worker.Request{Op: "code.parse", Args: raws[i]})
			var re *worker.RequestError
			switch {
			case errors.As(err, &re):
				outcomes[i] = re.Code + ": " + re.Message
			case err != nil:
				outcomes[i] = "error: " + err.Error()
			default:
				outcomes[i] = fmt.Sprintf("ok: %d bytes of reply", len(b))
			}
		}()
	}
	wg.Wait()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms)
	after, peak := rssKB()
	for i, o := range outcomes {
		fmt.Printf("OUTCOME %s %s\n", reqs[i]["language"], o)
	}
	fmt.Printf("MEMORY base_kb=%.0f peak_kb=%.0f after_kb=%.0f go_heap_base=%d go_heap_after=%d\n", base, peak, after, goBase, ms.HeapInuse)
}

// TestSixteenHostileParsesAreBounded is the attack of issue 27: 16 cells
// at once ask the host to parse 760 KB of brackets (which took klbr-core
// to 2.4 GB and more). Each must end in a clear parse_limit error or a
// result, the parsing process's peak must stay within the parse budget
// (MaxParses × MaxParseHeap), and its memory must return to its baseline.
// The parses run in a process of their own, so its peak is theirs alone.
func TestSixteenHostileParsesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("parses 12 MB of hostile source")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostileParsesChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), hostileChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var base, peak, after float64
	var goBase, goAfter uint64
	outcomes := 0
	s := bufio.NewScanner(strings.NewReader(string(out)))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		line := s.Text()
		if o, ok := strings.CutPrefix(line, "OUTCOME "); ok {
			outcomes++
			lang, what, _ := strings.Cut(o, " ")
			t.Logf("%s: %.160s", lang, what)
			if !strings.HasPrefix(what, "ok: ") && !(strings.HasPrefix(what, "parse_limit: ") && strings.Contains(what, "open_file")) {
				t.Errorf("%s: neither a result nor a clear parse_limit error: %.300s", lang, what)
			}
		}
		if m, ok := strings.CutPrefix(line, "MEMORY "); ok {
			fmt.Sscanf(m, "base_kb=%f peak_kb=%f after_kb=%f go_heap_base=%d go_heap_after=%d", &base, &peak, &after, &goBase, &goAfter)
		}
	}
	if outcomes != 16 || base == 0 {
		t.Fatalf("the child reported %d outcomes, base %.0f kB:\n%s", outcomes, base, out)
	}
	const mib = 1024.0
	t.Logf("RSS base %.0f MiB, peak %.0f MiB, after %.0f MiB; Go heap in use %d -> %d MiB",
		base/mib, peak/mib, after/mib, goBase>>20, goAfter>>20)
	// The budget, plus what Go's heap holds meanwhile (16 requests of
	// 760 KB, decoded and copied) and the lexer's chunk copies.
	// Under the race detector its shadow of the Go heap comes on top.
	budget := float64(MaxParses*MaxParseHeap+raceShadow)/1024 + 96*mib
	if peak-base > budget {
		t.Errorf("peak RSS %.0f MiB over a baseline of %.0f MiB: more than the parse budget of %.0f MiB", peak/mib, base/mib, budget/mib)
	}
	if after-base > 32*mib+raceShadow/1024 {
		t.Errorf("RSS after the parses is %.0f MiB, %.0f MiB over the baseline: the C heap was not given back", after/mib, (after-base)/mib)
	}
	if goAfter > goBase+16<<20 {
		t.Errorf("Go heap in use grew from %d to %d MiB", goBase>>20, goAfter>>20)
	}
}

// One hostile parse stops at the memory bound with a LimitError, and an
// ordinary file at the size bound parses well within it.
func TestParseBounds(t *testing.T) {
	py, _ := Lookup("python")
	_, err := Parse(context.Background(), py, []byte(hostileSource("python", "dense")), nil)
	var le *LimitError
	if !errors.As(err, &le) || le.What != "memory" && le.What != "time" {
		t.Fatalf("760 KB of dense brackets: %v, want a memory (or time) LimitError", err)
	}
	src := big10k()
	for len(src)+len(big10k()) <= MaxSourceBytes {
		src = append(src, big10k()...)
	}
	res, err := Parse(context.Background(), py, src, nil)
	if err != nil {
		t.Fatalf("an ordinary %d-byte file: %v", len(src), err)
	}
	if res.heapPeak <= 0 || res.heapPeak > MaxParseHeap/2 {
		t.Errorf("an ordinary %d-byte file held %d MiB of C heap: want some, and under half the bound (%d MiB)",
			len(src), res.heapPeak>>20, MaxParseHeap>>20)
	}
	t.Logf("%d bytes of ordinary Python: C heap peak %d MiB", len(src), res.heapPeak>>20)
	_, err = Parse(context.Background(), py, make([]byte, MaxSourceBytes+1), nil)
	if !errors.As(err, &le) || le.What != "size" {
		t.Fatalf("a source over the size bound: %v", err)
	}
}

// A source over the size bound is refused before it is parsed, with the
// parse_limit code the SDK raises as ParseLimit.
func TestOpsSizeBoundIsAParseLimit(t *testing.T) {
	o := NewOps(nil, behaviorTree)
	_, re := call(t, o, "code.parse", map[string]any{"path": "a.py", "text": strings.Repeat("x", MaxSourceBytes+1)})
	if re == nil || re.Code != "parse_limit" || !strings.Contains(re.Message, "open_file") {
		t.Fatalf("over the size bound: %+v", re)
	}
}

// A cancelled request stops its parse and frees its slot.
func TestOpsCancelledParseFreesItsSlot(t *testing.T) {
	o := NewOps(nil, behaviorTree)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	raw, _ := json.Marshal(map[string]any{"language": "python", "text": hostileSource("python", "nested")})
	for range MaxParses + 1 {
		if _, err := o.HandleRequest(ctx, worker.Request{Op: "code.parse", Args: raw}); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v", err)
		}
	}
	if len(o.slots) != 0 {
		t.Fatalf("%d slots still held", len(o.slots))
	}
}
