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
// names the child. Everything else passes through.
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
	s, err := g.st.Session(ctx, session)
	if err != nil || s.ParentID == "" {
		return g.h.HandleRequest(ctx, r) // a root (or no session: the handler says so)
	}
	j, err := g.st.ChildJobOf(ctx, session)
	if err != nil && !errors.Is(err, store.ErrNoJob) {
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	spec, _ := store.ChildSpecOf(j)
	if err != nil || !slices.Contains(spec.Delegate, r.Op) {
		return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
			"%s: refused: this session (%s) is a child agent, and its parent did not delegate %s to it; "+
				"report through `await agents.finish(result)` (a parent delegates with agents.spawn(..., delegate=[%q]))",
			r.Op, session, r.Op, r.Op)}
	}
	out, err := g.h.HandleRequest(ctx, r)
	if err != nil {
		return out, err
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(out, &m) != nil {
		return out, nil
	}
	m["child"], _ = json.Marshal(map[string]any{"job": j.ID, "session": session, "parent": s.ParentID})
	return json.Marshal(m)
}
