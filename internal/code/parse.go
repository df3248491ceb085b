package code

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
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
)

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

// Parse parses src as l and runs the queries over it.
func Parse(ctx context.Context, l *Language, src []byte, queries []*Query) (*Result, error) {
	if len(src) > MaxSourceBytes {
		return nil, fmt.Errorf("source is %d bytes, at most %d", len(src), MaxSourceBytes)
	}
	if l.TextOnly {
		if len(queries) > 0 {
			return nil, NoGrammar(l)
		}
		return &Result{Language: l.Name, Grammar: l.Grammar, Bytes: len(src), Errors: []Diagnostic{}, Queries: []QueryResult{}}, nil
	}
	p := sitter.NewParser()
	defer p.Close()
	if err := p.SetLanguage(l.ts); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	// Cancellation through the parser's own flag, pinned for the parse:
	// ParseWithOptions' progress callback registers its options with
	// go-pointer and never releases them, and ParseCtx stores into the
	// parser's flag pointer, which is nil unless one was set.
	flag := new(uintptr)
	var pin runtime.Pinner
	pin.Pin(flag)
	defer pin.Unpin()
	p.SetCancellationFlag(flag)
	defer p.SetCancellationFlag(nil)
	defer context.AfterFunc(ctx, func() { atomic.StoreUintptr(flag, 1) })()
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
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("the parser gave up")
	}
	defer tree.Close()
	root := tree.RootNode()
	res := &Result{Language: l.Name, Grammar: l.Grammar, RootNode: root.Kind(), Bytes: len(src), Errors: []Diagnostic{}, Queries: []QueryResult{}}
	res.Errors, res.ErrorsTruncated = diagnostics(root)
	t1 := time.Now()
	res.ParseMicros = t1.Sub(t0).Microseconds()
	for _, q := range queries {
		qr, err := run(ctx, q, root, src)
		if err != nil {
			return nil, err
		}
		res.Queries = append(res.Queries, qr)
	}
	res.QueryMicros = time.Since(t1).Microseconds()
	return res, nil
}

func run(ctx context.Context, q *Query, root *sitter.Node, src []byte) (qr QueryResult, err error) {
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
