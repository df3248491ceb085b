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
// unless its spawn delegated op (a *worker.RequestError with code refused,
// whose message ends with how). It returns the child that speaks, or nil
// for a root session. Cells (Guard) and durable observers ask it alike.
func Delegated(ctx context.Context, st *store.Store, session, op, how string) (*ChildRef, error) {
	if !slices.Contains(Delegable, op) {
		return nil, nil
	}
	s, err := st.Session(ctx, session)
	if err != nil || s.ParentID == "" {
		return nil, nil // a root (or no session: the handler says so)
	}
	j, err := st.ChildJobOf(ctx, session)
	if err != nil && !errors.Is(err, store.ErrNoJob) {
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	spec, _ := store.ChildSpecOf(j)
	if err != nil || !slices.Contains(spec.Delegate, op) {
		return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
			"%s: refused: this session (%s) is a child agent, and its parent did not delegate %s to it; "+
				"%s (a parent delegates with agents.spawn(..., delegate=[%q]))",
			op, session, op, how, op)}
	}
	return &ChildRef{Job: j.ID, Session: session, Parent: s.ParentID}, nil
}
