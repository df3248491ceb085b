package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/strictjson"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Ops answers the history.* host requests of cells, confined to the cell's
// own session.
type Ops struct{ r *Reader }

// NewOps returns the handler.
func NewOps(r *Reader) *Ops { return &Ops{r: r} }

// maxArgs bounds a request's arguments.
const maxArgs = 16 << 10

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, req worker.Request) (json.RawMessage, error) {
	session := workbench.SessionFrom(ctx)
	if session == "" {
		return nil, invalid("%s: no session", req.Op)
	}
	if len(req.Args) > maxArgs {
		return nil, invalid("%s: arguments over %d bytes", req.Op, maxArgs)
	}
	var res any
	var err error
	switch req.Op {
	case "history.search":
		var a struct {
			Query string `json:"query"`
			Scope *Scope `json:"scope"`
			Limit int    `json:"limit"`
		}
		if err := decode(req, &a); err != nil {
			return nil, err
		}
		var sc Scope
		if a.Scope != nil {
			sc = *a.Scope
		}
		res, err = o.r.Search(ctx, session, a.Query, sc, a.Limit)
	case "history.describe", "history.children":
		var a struct {
			Ref string `json:"ref"`
		}
		if err := decode(req, &a); err != nil {
			return nil, err
		}
		if req.Op == "history.describe" {
			res, err = o.r.Describe(ctx, session, a.Ref)
		} else {
			res, err = o.r.Children(ctx, session, a.Ref)
		}
	case "history.read":
		var a struct {
			Ref      string `json:"ref"`
			MaxBytes int    `json:"max_bytes"`
			Offset   int64  `json:"offset"`
		}
		if err := decode(req, &a); err != nil {
			return nil, err
		}
		res, err = o.r.Read(ctx, session, a.Ref, a.MaxBytes, a.Offset)
	default:
		return nil, &worker.RequestError{Code: "unsupported", Message: req.Op + " is not a history operation (search, describe, read, children)"}
	}
	if err != nil {
		code := "invalid"
		if errors.Is(err, store.ErrUnknownRef) {
			code = "not_found"
		} else if errors.Is(err, ErrOutOfScope) {
			code = "forbidden"
		}
		return nil, &worker.RequestError{Code: code, Message: err.Error()}
	}
	return json.Marshal(res)
}

func decode(req worker.Request, v any) error {
	if err := strictjson.Decode(req.Args, v); err != nil {
		return invalid("%s: %v", req.Op, err)
	}
	return nil
}

func invalid(format string, a ...any) error {
	return &worker.RequestError{Code: "invalid", Message: fmt.Sprintf(format, a...)}
}
