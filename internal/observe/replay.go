package observe

import (
	"context"
	"fmt"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
)

// Replayed is one event a replay delivered again, with fake effects: what
// the handler answered, never carried out.
type Replayed struct {
	Event    int64                   `json:"event"`
	Kind     string                  `json:"kind"`
	Commands []store.ProposedCommand `json:"commands"`
	State    any                     `json:"state,omitempty"`
	Problem  string                  `json:"problem,omitempty"`
}

// MaxReplay bounds the events one replay goes over.
const MaxReplay = 10000

// Replay delivers session's events from..to (0: all) of the kinds the
// active release binds handler to, again, to that handler under the active
// release, starting from an empty state that each answer replaces. Effects
// are fake: nothing is acknowledged, no state is written, no command is
// minted or carried out; the answers are returned.
func (r *Runner) Replay(ctx context.Context, session, handler string, from, to int64) ([]Replayed, error) {
	s, err := r.cfg.Store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	var ob *hooks.ObserverBinding
	b := r.cfg.Hooks.Binding(s.PolicyRevision)
	for i := range b.Observers {
		if b.Observers[i].Handler == handler {
			ob = &b.Observers[i]
		}
	}
	if ob == nil {
		return nil, fmt.Errorf("the active release of %s binds no observer %q", session, handler)
	}
	events, err := r.cfg.Store.ObserverEvents(ctx, session, ob.Events, from, to, MaxReplay)
	if err != nil {
		return nil, err
	}
	state := []byte(`{}`)
	out := []Replayed{}
	for _, e := range events {
		o := r.cfg.Hooks.Observe(ctx, session, handler, hooks.ObserveInput{Event: e, State: state, StateVersion: ob.StateVersion})
		rp := Replayed{Event: e.ID, Kind: e.Kind, Commands: o.Answer.Commands, Problem: o.Problem}
		if rp.Commands == nil {
			rp.Commands = []store.ProposedCommand{}
		}
		if o.Answer.State != nil {
			state = o.Answer.State
			rp.State = o.Answer.State
		}
		out = append(out, rp)
	}
	return out, nil
}
