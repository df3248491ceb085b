package spend

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/strictjson"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Ledger is the part of the store the spend ops read.
type Ledger interface {
	SpendSince(ctx context.Context, since time.Time) (store.SpendTotal, error)
	SpendBy(ctx context.Context, group string, since time.Time, loc *time.Location) ([]store.SpendTotal, error)
}

// Summary is what spend.summary answers a cell: the view of klbr-core
// spend (GET /v1/spend), read-only.
type Summary struct {
	By     string             `json:"by"`
	Since  time.Time          `json:"since"`
	Total  store.SpendTotal   `json:"total"`
	Groups []store.SpendTotal `json:"groups"`
	State  *State             `json:"state,omitempty"`
}

// Ops answers the spend.* host requests of cells: the ledger and the caps,
// read-only (a cell cannot raise a cap or write a row).
type Ops struct {
	ledger Ledger
	loc    *time.Location // the caps' time zone: a day of by="day"
	meter  *Meter         // nil: no caps' state
}

// NewOps returns the handler; m may be nil.
func NewOps(l Ledger, loc *time.Location, m *Meter) *Ops { return &Ops{ledger: l, loc: loc, meter: m} }

// MaxOpArgs bounds a spend request's arguments.
const MaxOpArgs = 1 << 10

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, req worker.Request) (json.RawMessage, error) {
	if req.Op != "spend.summary" {
		return nil, &worker.RequestError{Code: "unsupported", Message: req.Op + " is not a spend operation (summary; spend is read-only to cells)"}
	}
	if len(req.Args) > MaxOpArgs {
		return nil, opInvalid("spend.summary: arguments over %d bytes", MaxOpArgs)
	}
	var a struct {
		By    string `json:"by"`
		Since string `json:"since"` // RFC 3339; "": all of the ledger
	}
	if err := strictjson.Decode(req.Args, &a); err != nil {
		return nil, opInvalid("spend.summary: %v", err)
	}
	if a.By == "" {
		a.By = "day"
	}
	if !slices.Contains(store.SpendGroups, a.By) {
		return nil, opInvalid("spend.summary: by %q: one of %v", a.By, store.SpendGroups)
	}
	out := Summary{By: a.By, Groups: []store.SpendTotal{}}
	if a.Since != "" {
		t, err := time.Parse(time.RFC3339, a.Since)
		if err != nil {
			return nil, opInvalid("spend.summary: since %q is not an RFC 3339 time", a.Since)
		}
		out.Since = t
	}
	var err error
	if out.Total, err = o.ledger.SpendSince(ctx, out.Since); err != nil {
		return nil, fmt.Errorf("spend.summary: %w", err)
	}
	groups, err := o.ledger.SpendBy(ctx, a.By, out.Since, o.loc)
	if err != nil {
		return nil, fmt.Errorf("spend.summary: %w", err)
	}
	out.Groups = append(out.Groups, groups...)
	if o.meter != nil {
		st := o.meter.State()
		out.State = &st
	}
	return json.Marshal(out)
}

func opInvalid(format string, a ...any) error {
	return &worker.RequestError{Code: "invalid", Message: fmt.Sprintf(format, a...)}
}
