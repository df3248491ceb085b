package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/klbr-dev/klbr/internal/store"
)

// Observer command ops.
var ObserverOps = []string{"local.send", "discord.send", "discord.react", "discord.mark", "runtime.wakeup"}

// Bounds of an observer's answer.
const MaxCommands = 8

// ObserverAnswer is an observer's validated answer.
type ObserverAnswer struct {
	State    json.RawMessage // nil: unchanged
	Commands []store.ProposedCommand
}

// decodeAnswer validates {"state"?: {...}, "commands"?: [{"op", "args"}]}.
func decodeAnswer(out json.RawMessage) (ObserverAnswer, error) {
	var r struct {
		State    json.RawMessage         `json:"state"`
		Commands []store.ProposedCommand `json:"commands"`
	}
	var a ObserverAnswer
	if err := json.Unmarshal(out, &r); err != nil {
		return a, fmt.Errorf("answered %s, not {state, commands}", truncate(out))
	}
	if len(r.State) > 0 && string(r.State) != "null" {
		var m map[string]any
		if json.Unmarshal(r.State, &m) != nil {
			return a, fmt.Errorf("state is %s, not an object", truncate(r.State))
		}
		if len(r.State) > store.MaxHookState {
			return a, fmt.Errorf("state is %d bytes (at most %d)", len(r.State), store.MaxHookState)
		}
		a.State = r.State
	}
	if len(r.Commands) > MaxCommands {
		return a, fmt.Errorf("%d commands (at most %d)", len(r.Commands), MaxCommands)
	}
	for i, c := range r.Commands {
		if !slices.Contains(ObserverOps, c.Op) {
			return a, fmt.Errorf("command %d: op %q is not one of %v", i, c.Op, ObserverOps)
		}
		if len(c.Args) > 0 {
			var m map[string]any
			if json.Unmarshal(c.Args, &m) != nil {
				return a, fmt.Errorf("command %d: args are not an object", i)
			}
		}
		if len(c.Args) > 8<<10 {
			return a, fmt.Errorf("command %d: args of %d bytes (at most 8 KiB)", i, len(c.Args))
		}
	}
	a.Commands = r.Commands
	return a, nil
}

// ObserveInput is what an observer is called with.
type ObserveInput struct {
	Event        store.ObserverEvent `json:"event"`
	State        json.RawMessage     `json:"state"`
	StateVersion int                 `json:"state_version"`
}

// Observation is one observer invocation's result.
type Observation struct {
	Answer  ObserverAnswer
	Release string
	Problem string // set when it failed: the delivery is retried
}

// Observe calls an observer handler with an event and its state, under the
// session's active behavior, in the session's observer worker (not the one
// the turn loop's hooks use). The invocation is recorded under the event's
// kind as slot.
func (d *Dispatcher) Observe(ctx context.Context, session, handler string, in ObserveInput) Observation {
	s, _ := Lookup(in.Event.Kind)
	c := d.invokeKey(ctx, session, observerKey(session), nil, in.Event.Kind, handler, in, s.Deadline)
	o := Observation{Release: c.rec.Release}
	switch {
	case c.rec.Outcome != "ok":
		o.Problem = fmt.Sprintf("%s %s: %s", handler, c.rec.Outcome, c.rec.Error)
	default:
		a, err := decodeAnswer(c.result)
		if err != nil {
			o.Problem, c.rec.Outcome = fmt.Sprintf("%s: %v", handler, err), "invalid"
		}
		o.Answer = a
	}
	if o.Problem != "" {
		c.rec.Error = o.Problem
	}
	d.finish(c)
	return o
}
