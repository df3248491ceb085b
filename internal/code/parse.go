package code

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	sitter "github.com/tree-sitter/go-tree-sitter"
)

// Bounds of one parse.
const (
	MaxSourceBytes = 768 << 10 // a source travels in one protocol frame (1 MiB)
	MaxQueryBytes  = 64 << 10
	MaxCaptures    = 50000 // per query, across its matches
	MaxDiagnostics = 200
	MaxQueryTime   = 5 * time.Second // one query's matching, per request

	// MaxParseTime bounds one parse (tree-sitter building the tree, not the
	// queries, which MaxQueryTime bounds), in wall time. An ordinary
	// 768 KiB file parses in about 0.35 s on an idle core; the bound is
	// generous because a busy host stretches wall time, and MaxParseHeap
	// stops the costly inputs first.
	MaxParseTime = 10 * time.Second
	// MaxParseHeap bounds the C memory one parse and its queries hold. An
	// ordinary 768 KiB Python file needs 36 MiB; 760 KB of brackets
	// took 250-300 MB before this bound.
	MaxParseHeap = 128 << 20
	// MaxParses is how many parses Ops runs at once (more wait their
	// turn): parsing holds at most MaxParses × MaxParseHeap of C memory.
	MaxParses = 2
)

// trimAbove is the C-heap peak after which a parse hands free memory back
// to the system (malloc_trim walks every arena: not worth it for small files).
const trimAbove = 16 << 20

// LimitError is a parse that a bound stopped: the source is too large, its
// parse takes too long or needs too much memory. No partial tree is given.
type LimitError struct {
	What  string // "size", "time" or "memory"
	Limit string
	Bytes int // the source's size

	heapPeak int64 // the C heap the parse held when it stopped
}

func tooLarge(n int) *LimitError {
	return &LimitError{What: "size", Limit: fmt.Sprintf("%d bytes (%d KiB)", MaxSourceBytes, MaxSourceBytes>>10), Bytes: n}
}

func (e *LimitError) Error() string {
	switch e.What {
	case "size":
		return fmt.Sprintf("the source is %d bytes, over the %s a parse takes; split the file or read it with open_file and search", e.Bytes, e.Limit)
	case "time":
		return fmt.Sprintf("parsing %d bytes took over %s and was stopped; the source is pathological "+
			"(deeply nested or densely packed brackets?) or the host is very busy: try again, or read it with open_file", e.Bytes, e.Limit)
	default:
		return fmt.Sprintf("parsing %d bytes needed over %s of the host's memory and was stopped; the source is pathological "+
			"(deeply nested or densely packed brackets?): read it with open_file instead", e.Bytes, e.Limit)
	}
}

// parseChunk is how much of the source one read of the lexer gets.
const parseChunk = 16 << 10

// Point is a 0-based row and a byte column, as tree-sitter counts them.
type Point [2]uint

// Span is a node's UTF-8 byte range and its points.
type Span struct {
	StartByte uint  `json:"start_byte"`
	EndByte   uint  `json:"end_byte"`
	Start     Point `json:"start"`
	End       Point `json:"end"`
}

func spanOf(n *sitter.Node) Span {
	s, e := n.StartPosition(), n.EndPosition()
	return Span{StartByte: n.StartByte(), EndByte: n.EndByte(), Start: Point{s.Row, s.Column}, End: Point{e.Row, e.Column}}
}

// Capture is one captured node of a match.
type Capture struct {
	Name string `json:"name"`
	Node string `json:"node"` // the node's kind
	Span
}

// Match is one match of a query's pattern.
type Match struct {
	Pattern  uint      `json:"pattern"`
	Captures []Capture `json:"captures"`
}

// Diagnostic is one parse error of partially invalid source: an ERROR
// node (text the grammar could not place) or a MISSING one (a token the
// parser inserted to recover, e.g. a closing brace).
type Diagnostic struct {
	Kind string `json:"kind"` // "error" or "missing"
	Node string `json:"node"` // for missing: the kind of the node that is missing
	Span
}

// QueryResult is what one query found. PatternLines gives each pattern's
// 1-based line in the query text, so a match names the pattern that found it.
type QueryResult struct {
	Name         string  `json:"name"`
	From         string  `json:"from"` // the query's file in the release, or "raw"
	PatternLines []int   `json:"pattern_lines"`
	Matches      []Match `json:"matches"`
	Truncated    bool    `json:"truncated,omitempty"`
}

// MarshalJSON writes a query result compactly: capture names and node
// kinds once, in tables, and each match as [pattern, [[name, node,
// start_byte, end_byte, start_row, start_col, end_row, end_col], ...]]
// (indexes into the tables). A 10,000-line file's symbols then fit a
// protocol frame with room to spare.
func (qr QueryResult) MarshalJSON() ([]byte, error) {
	var names, nodes []string
	nameIdx, nodeIdx := map[string]int{}, map[string]int{}
	index := func(m map[string]int, list *[]string, s string) int {
		i, ok := m[s]
		if !ok {
			i = len(*list)
			m[s] = i
			*list = append(*list, s)
		}
		return i
	}
	matches := make([][2]any, 0, len(qr.Matches))
	for _, m := range qr.Matches {
		caps := make([][8]uint, 0, len(m.Captures))
		for _, c := range m.Captures {
			caps = append(caps, [8]uint{uint(index(nameIdx, &names, c.Name)), uint(index(nodeIdx, &nodes, c.Node)),
				c.StartByte, c.EndByte, c.Start[0], c.Start[1], c.End[0], c.End[1]})
		}
		matches = append(matches, [2]any{m.Pattern, caps})
	}
	return json.Marshal(struct {
		Name         string   `json:"name"`
		From         string   `json:"from"`
		PatternLines []int    `json:"pattern_lines"`
		CaptureNames []string `json:"capture_names"`
		NodeKinds    []string `json:"node_kinds"`
		Matches      [][2]any `json:"matches"`
		Truncated    bool     `json:"truncated,omitempty"`
	}{qr.Name, qr.From, qr.PatternLines, names, nodes, matches, qr.Truncated})
}

// Result is one parse of a source.
type Result struct {
	Language        string        `json:"language"`
	Grammar         string        `json:"grammar"`
	Errors          []Diagnostic  `json:"errors"`
	ErrorsTruncated bool          `json:"errors_truncated,omitempty"`
	Queries         []QueryResult `json:"queries"`
	RootNode        string        `json:"root_node"`
	ParseMicros     int64         `json:"parse_us"`
	QueryMicros     int64         `json:"query_us"`
	DetectedBy      string        `json:"detected_by,omitempty"`
	Bytes           int           `json:"bytes"`
	heapPeak        int64         // the most C memory the parse and its queries held
}

// Query is a compiled query and where it came from.
type Query struct {
	Name string
	From string
	q    *sitter.Query
	text string
	own  bool // compiled for this request only: closed after it
}

// QueryError is a query the language's grammar refuses: a node type or
// field it does not have, bad syntax, an impossible pattern.
type QueryError struct {
	Language string
	From     string
	Kind     string
	Row, Col uint // 1-based
	Offset   uint
	Message  string
}

func (e *QueryError) Error() string {
	return fmt.Sprintf("%s query (%s) at %d:%d: %s %s", e.Language, e.From, e.Row, e.Col, e.Kind, e.Message)
}

var queryErrorKinds = map[sitter.QueryErrorKind]string{
	sitter.QueryErrorSyntax: "invalid syntax", sitter.QueryErrorNodeType: "the grammar has no node type",
	sitter.QueryErrorField: "the grammar has no field", sitter.QueryErrorCapture: "invalid capture name",
	sitter.QueryErrorPredicate: "invalid predicate", sitter.QueryErrorStructure: "impossible pattern",
	sitter.QueryErrorLanguage: "incompatible language",
}

// Compile compiles text for l. The caller closes a query with own set.
func Compile(l *Language, name, from, text string) (*Query, error) {
	if len(text) > MaxQueryBytes {
		return nil, &QueryError{Language: l.Name, From: from, Kind: "too large", Message: fmt.Sprintf("over %d bytes", MaxQueryBytes)}
	}
	if l.TextOnly {
		return nil, NoGrammar(l)
	}
	if why := unsafeQuery(text); why != "" {
		return nil, &QueryError{Language: l.Name, From: from, Kind: "refused", Row: 1, Col: 1, Message: why}
	}
	q, qerr := sitter.NewQuery(l.ts, text)
	if qerr != nil {
		msg := qerr.Message
		if qerr.Kind == sitter.QueryErrorNodeType || qerr.Kind == sitter.QueryErrorField {
			msg = fmt.Sprintf("%q", msg)
		}
		return nil, &QueryError{Language: l.Name, From: from, Kind: queryErrorKinds[qerr.Kind],
			Row: qerr.Row + 1, Col: qerr.Column + 1, Offset: qerr.Offset, Message: msg}
	}
	return &Query{Name: name, From: from, q: q, text: text, own: true}, nil
}

// Close frees a per-request query.
func (q *Query) Close() {
	if q != nil && q.own {
		q.q.Close()
	}
}

func patternLines(q *Query) []int {
	n := q.q.PatternCount()
	out := make([]int, n)
	line, at := 1, uint(0)
	for i := uint(0); i < n; i++ {
		start := q.q.StartByteForPattern(i)
		for ; at < start && at < uint(len(q.text)); at++ {
			if q.text[at] == '\n' {
				line++
			}
		}
		out[i] = line
	}
	return out
}

// Parse parses src as l and runs the queries over it, within the bounds
// above: a *LimitError says which one stopped it.
func Parse(ctx context.Context, l *Language, src []byte, queries []*Query) (*Result, error) {
	if len(src) > MaxSourceBytes {
		return nil, tooLarge(len(src))
	}
	if l.TextOnly {
		if len(queries) > 0 {
			return nil, NoGrammar(l)
		}
		return &Result{Language: l.Name, Grammar: l.Grammar, Bytes: len(src), Errors: []Diagnostic{}, Queries: []QueryResult{}}, nil
	}
	h := newHeap(MaxParseHeap)
	defer h.free()
	// The parse's own deadline and the caller's context both raise the
	// parser's flag. The flag is C memory freed above: wait for a callback
	// that already started before freeing it.
	pctx, cancel := context.WithTimeout(ctx, MaxParseTime)
	defer cancel()
	fired := make(chan struct{})
	stop := context.AfterFunc(pctx, func() { h.cancel(); close(fired) })
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	h.begin()
	res, err := parseCounted(ctx, pctx, h, l, src, queries)
	h.end()
	if h.peak() > trimAbove {
		trimHeap()
	}
	var le *LimitError
	switch {
	case res != nil:
		res.heapPeak = h.peak()
	case errors.As(err, &le):
		le.heapPeak = h.peak()
	}
	return res, err
}

// parseCounted is Parse with every C allocation counted against h.
func parseCounted(ctx, pctx context.Context, h heap, l *Language, src []byte, queries []*Query) (*Result, error) {
	p := sitter.NewParser()
	defer p.Close()
	if err := p.SetLanguage(l.ts); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	// Cancellation through the parser's own flag: ParseWithOptions'
	// progress callback registers its options with go-pointer and never
	// releases them, and ParseCtx stores into the parser's flag pointer,
	// which is nil unless one was set.
	p.SetCancellationFlag(h.flag())
	defer p.SetCancellationFlag(nil)
	t0 := time.Now()
	// Bounded chunks: go-tree-sitter copies every chunk it hands the lexer
	// into C memory and frees them only when the parse ends; its Parse hands
	// out the whole rest of the source on every read. The lexer reads again
	// only when it moves back, so this is no faster on ordinary files
	// (BenchmarkParse10kLines), but it bounds what each read copies.
	tree := p.ParseWithOptions(func(i int, _ sitter.Point) []byte {
		if i >= len(src) {
			return nil
		}
		return src[i:min(i+parseChunk, len(src))]
	}, nil, nil)
	if tree == nil {
		return nil, stopped(ctx, pctx, h, len(src))
	}
	defer tree.Close()
	root := tree.RootNode()
	res := &Result{Language: l.Name, Grammar: l.Grammar, RootNode: root.Kind(), Bytes: len(src), Errors: []Diagnostic{}, Queries: []QueryResult{}}
	res.Errors, res.ErrorsTruncated = diagnostics(root)
	t1 := time.Now()
	res.ParseMicros = t1.Sub(t0).Microseconds()
	for _, q := range queries {
		qr, err := run(ctx, h, q, root, src)
		if err != nil {
			return nil, err
		}
		res.Queries = append(res.Queries, qr)
	}
	res.QueryMicros = time.Since(t1).Microseconds()
	return res, nil
}

// stopped says why a parse returned no tree.
func stopped(ctx, pctx context.Context, h heap, n int) error {
	switch {
	case h.over():
		return &LimitError{What: "memory", Limit: fmt.Sprintf("%d MiB", MaxParseHeap>>20), Bytes: n}
	case ctx.Err() != nil:
		return ctx.Err()
	case pctx.Err() != nil:
		return &LimitError{What: "time", Limit: MaxParseTime.String(), Bytes: n}
	}
	return errors.New("the parser gave up")
}

func run(ctx context.Context, h heap, q *Query, root *sitter.Node, src []byte) (qr QueryResult, err error) {
	qr = QueryResult{Name: q.Name, From: q.From, PatternLines: patternLines(q), Matches: []Match{}}
	qc := sitter.NewQueryCursor()
	defer qc.Close()
	// A pathological pattern can take exponential time: bound it, and say
	// the result is cut short when it was.
	qc.SetTimeoutMicros(uint64(MaxQueryTime.Microseconds()))
	start := time.Now()
	defer func() {
		if time.Since(start) >= MaxQueryTime {
			qr.Truncated = true
		}
	}()
	names := q.q.CaptureNames()
	ms := qc.Matches(q.q, root, src)
	total := 0
	for m := ms.Next(); m != nil; m = ms.Next() {
		if h.over() {
			return qr, &LimitError{What: "memory", Limit: fmt.Sprintf("%d MiB", MaxParseHeap>>20), Bytes: len(src)}
		}
		if total%256 == 0 {
			if err := ctx.Err(); err != nil {
				return qr, err
			}
		}
		if total+len(m.Captures) > MaxCaptures {
			qr.Truncated = true
			break
		}
		out := Match{Pattern: m.PatternIndex, Captures: make([]Capture, 0, len(m.Captures))}
		for _, c := range m.Captures {
			out.Captures = append(out.Captures, Capture{Name: names[c.Index], Node: c.Node.Kind(), Span: spanOf(&c.Node)})
		}
		total += len(out.Captures)
		qr.Matches = append(qr.Matches, out)
	}
	return qr, nil
}

// diagnostics lists the outermost ERROR nodes and every MISSING node,
// descending only into subtrees that hold an error.
func diagnostics(root *sitter.Node) ([]Diagnostic, bool) {
	out := []Diagnostic{}
	if !root.HasError() {
		return out, false
	}
	c := root.Walk()
	defer c.Close()
	for {
		n := c.Node()
		descend := false
		switch {
		case n.IsMissing():
			out = append(out, Diagnostic{Kind: "missing", Node: n.Kind(), Span: spanOf(n)})
		case n.IsError():
			out = append(out, Diagnostic{Kind: "error", Node: "ERROR", Span: spanOf(n)})
		case n.HasError():
			descend = true
		}
		if len(out) >= MaxDiagnostics {
			return out, true
		}
		if descend && c.GotoFirstChild() {
			continue
		}
		for !c.GotoNextSibling() {
			if !c.GotoParent() {
				return out, false
			}
		}
	}
}
