package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Guard wraps the handler of a speech family (local.*, discord.*): in a
// child agent's cell, a delegable op (local.send, discord.send, …) is
// refused unless the spawn delegated it; a delegated one runs as the
// child's (in its session, recorded on its speech lane) and its receipt
// names the child. Everything else passes through. Durable observers
// bound in a child's session are checked the same way (Delegated).
func Guard(st *store.Store, h worker.Handler) worker.Handler {
	return guard{st: st, h: h}
}

type guard struct {
	st *store.Store
	h  worker.Handler
}

func (g guard) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	if !slices.Contains(Delegable, r.Op) {
		return g.h.HandleRequest(ctx, r)
	}
	session := workbench.SessionFrom(ctx)
	child, err := Delegated(ctx, g.st, session, r.Op, "report through `await agents.finish(result)`")
	if err != nil {
		return nil, err
	}
	out, err := g.h.HandleRequest(ctx, r)
	if err != nil || child == nil {
		return out, err
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(out, &m) != nil {
		return out, nil
	}
	m["child"], _ = json.Marshal(child)
	return json.Marshal(m)
}

// ChildRef names a child agent in a delegated send's receipt.
type ChildRef struct {
	Job     int64  `json:"job"`
	Session string `json:"session"`
	Parent  string `json:"parent"`
}

// Delegated checks speech op of session, which is refused in a child agent
// unless every spawn from its root down to it delegated op (grant.go: a
// child holds only what its spawner held); the error is a
// *worker.RequestError with code refused, whose message ends with how. It
// returns the child that speaks, or nil for a root session. Cells (Guard)
// and durable observers ask it alike.
func Delegated(ctx context.Context, st *store.Store, session, op, how string) (*ChildRef, error) {
	if !slices.Contains(Delegable, op) {
		return nil, nil
	}
	links, err := chain(ctx, st, session)
	switch {
	case errors.Is(err, errNoSession):
		return nil, nil // the handler says so
	case errors.Is(err, store.ErrNoJob) || errors.Is(err, store.ErrUnknownSession):
		return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
			"%s: refused: %s is a child agent whose grant cannot be read (%v); %s", op, session, err, how)}
	case err != nil:
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	case len(links) == 0:
		return nil, nil // a root
	}
	for i, l := range links {
		if slices.Contains(l.spec.Delegate, op) {
			continue
		}
		if i == 0 {
			return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
				"%s: refused: this session (%s) is a child agent, and its parent did not delegate %s to it; "+
					"%s (a parent delegates with agents.spawn(..., delegate=[%q]))",
				op, session, op, how, op)}
		}
		who := "its spawner"
		if i > 1 {
			who = "its ancestor"
		}
		return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
			"%s: refused: this session (%s) is a child agent, and %s %s does not hold %s itself: "+
				"a child speaks only with what every spawn above it delegated; %s",
			op, session, who, l.session, op, how)}
	}
	return &ChildRef{Job: links[0].job.ID, Session: session, Parent: links[0].job.Session}, nil
}
