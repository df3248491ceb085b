package code

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/strictjson"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Ops answers the code.* host requests of cells: parsing a source a cell
// read from its workspace and running the named queries of the behavior
// release the cell runs under (or raw ones) over it. It reads no
// workspace file itself: the cell's klbr.code owns paths, hashes and
// patches; this side owns the grammars.
type Ops struct {
	releases *behavior.Releases // nil: always the fallback tree
	fallback fs.FS              // the tree of a cell that runs under no release
	cache    cache
	slots    chan struct{} // one per running parse (MaxParses)
}

// NewOps returns the handler. fallback is the default behavior tree.
func NewOps(releases *behavior.Releases, fallback fs.FS) *Ops {
	return &Ops{releases: releases, fallback: fallback, slots: make(chan struct{}, MaxParses)}
}

// ParseArgs are code.parse's arguments. The source is Text (valid UTF-8)
// or B64 (any bytes); Path only helps detect the language.
type ParseArgs struct {
	Path     string   `json:"path"`
	Language string   `json:"language"`
	Text     *string  `json:"text"`
	B64      *string  `json:"b64"`
	Queries  []string `json:"queries"`
	Raw      string   `json:"raw"`
}

// maxArgs bounds a request's arguments (the frame bounds them too).
const maxArgs = 1 << 20

// DecodeParseArgs decodes and checks code.parse's arguments.
func DecodeParseArgs(raw json.RawMessage) (ParseArgs, []byte, error) {
	var a ParseArgs
	if len(raw) > maxArgs {
		return a, nil, fmt.Errorf("arguments over %d bytes", maxArgs)
	}
	if err := strictjson.Decode(raw, &a); err != nil {
		return a, nil, err
	}
	var src []byte
	switch {
	case a.Text != nil && a.B64 != nil:
		return a, nil, errors.New("give the source as text or as b64, not both")
	case a.Text != nil:
		if !utf8.ValidString(*a.Text) {
			return a, nil, errors.New("text is not valid UTF-8 (send b64)")
		}
		src = []byte(*a.Text)
	case a.B64 != nil:
		b, err := base64.StdEncoding.DecodeString(*a.B64)
		if err != nil {
			return a, nil, fmt.Errorf("b64: %v", err)
		}
		src = b
	default:
		return a, nil, errors.New("no source (text or b64)")
	}
	if len(src) > MaxSourceBytes {
		return a, nil, tooLarge(len(src))
	}
	if len(a.Path) > 4096 || !utf8.ValidString(a.Path) {
		return a, nil, errors.New("path must be valid UTF-8 of at most 4096 bytes")
	}
	if len(a.Queries) > 16 {
		return a, nil, errors.New("at most 16 named queries per request")
	}
	if len(a.Raw) > MaxQueryBytes {
		return a, nil, fmt.Errorf("raw query over %d bytes", MaxQueryBytes)
	}
	return a, src, nil
}

func reqErr(code, format string, a ...any) error {
	return &worker.RequestError{Code: code, Message: fmt.Sprintf(format, a...)}
}

// tree is the behavior tree the asking cell runs under.
func (o *Ops) tree(ctx context.Context) (fs.FS, string) {
	if pin, ok := workbench.PinFrom(ctx); ok && pin.Release != "" && o.releases != nil {
		return os.DirFS(o.releases.Tree(pin.Release)), "release " + shortID(pin.Release)
	}
	return o.fallback, "the default behavior tree"
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, req worker.Request) (json.RawMessage, error) {
	switch req.Op {
	case "code.parse":
		res, err := o.parse(ctx, req.Args)
		if err != nil {
			return nil, err
		}
		return fit(res)
	case "code.languages":
		tree, name := o.tree(ctx)
		type entry struct {
			*Language
			Queries []string `json:"queries"`
		}
		var out []entry
		for _, l := range Languages() {
			out = append(out, entry{l, Available(tree, l.Name)})
		}
		return json.Marshal(map[string]any{"languages": out, "queries_from": name, "query_dir": QueryDir})
	default:
		return nil, reqErr("unsupported", "%s is not a code operation (parse, languages)", req.Op)
	}
}

func (o *Ops) parse(ctx context.Context, raw json.RawMessage) (*Result, error) {
	a, src, err := DecodeParseArgs(raw)
	var le *LimitError
	switch {
	case errors.As(err, &le):
		return nil, reqErr("parse_limit", "code.parse: %v", err)
	case err != nil:
		return nil, reqErr("invalid", "code.parse: %v", err)
	}
	var l *Language
	how := "argument"
	if a.Language != "" {
		var ok bool
		if l, ok = Lookup(a.Language); !ok {
			return nil, reqErr("unsupported_language", "no grammar for %q (languages: %s)", a.Language, strings.Join(Names(), ", "))
		}
	} else if l, how = Detect(a.Path, src); l == nil {
		return nil, reqErr("unsupported_language", "cannot tell the language of %q from its extension or a #! line; "+
			"pass language= (languages: %s)", a.Path, strings.Join(Names(), ", "))
	}
	tree, treeName := o.tree(ctx)
	var qs []*Query
	defer func() {
		for _, q := range qs {
			q.Close()
		}
	}()
	for _, name := range a.Queries {
		q, err := o.cache.load(tree, treeName, l, name)
		if err != nil {
			return nil, queryErr(err)
		}
		qs = append(qs, q)
	}
	if a.Raw != "" {
		q, err := Compile(l, "raw", "raw", a.Raw)
		if err != nil {
			return nil, queryErr(err)
		}
		qs = append(qs, q)
	}
	select {
	case o.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res, err := Parse(ctx, l, src, qs)
	<-o.slots
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("code.parse: %w", ctx.Err())
	case errors.As(err, &le):
		return nil, reqErr("parse_limit", "code.parse: %v", err)
	case err != nil:
		return nil, reqErr("failed", "code.parse: %v", err)
	}
	res.DetectedBy = how
	return res, nil
}

// MaxReplyBytes bounds a code.parse reply below the protocol frame's 1 MiB:
// a larger reply could not be sent at all.
const MaxReplyBytes = 960 << 10

// fit encodes res, dropping the last matches of its largest query (and
// marking it truncated) until the reply fits MaxReplyBytes.
func fit(res *Result) (json.RawMessage, error) {
	for {
		b, err := json.Marshal(res)
		if err != nil || len(b) <= MaxReplyBytes {
			return b, err
		}
		big := -1
		for i, q := range res.Queries {
			if big < 0 || len(q.Matches) > len(res.Queries[big].Matches) {
				big = i
			}
		}
		if big < 0 || len(res.Queries[big].Matches) == 0 {
			if len(res.Errors) > 0 {
				res.Errors, res.ErrorsTruncated = res.Errors[:len(res.Errors)/2], true
				continue
			}
			return nil, reqErr("failed", "code.parse: the reply is %d bytes, over %d", len(b), MaxReplyBytes)
		}
		q := &res.Queries[big]
		keep := len(q.Matches) * MaxReplyBytes / len(b) * 9 / 10
		q.Matches, q.Truncated = q.Matches[:keep], true
	}
}

func queryErr(err error) error {
	var qe *QueryError
	switch {
	case errors.Is(err, ErrNoGrammar):
		return reqErr("no_grammar", "%v", err)
	case errors.Is(err, ErrMissingQuery):
		return reqErr("missing_query", "%v", err)
	case errors.As(err, &qe):
		return reqErr("query_error", "%v", err)
	default:
		return reqErr("invalid", "%v", err)
	}
}
