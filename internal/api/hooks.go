package api

import (
	"encoding/json"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
)

// HooksStatus is the hooks' diagnostics: per slot counts since klbr-core
// started, every observer binding, and the loop limits on what observers
// may cause.
type HooksStatus struct {
	Slots     []hooks.SlotStats    `json:"slots"`
	Observers []store.ObserverStat `json:"observers"`
	Limits    LoopLimits           `json:"limits"`
}

// LoopLimits are the observers' loop limits.
type LoopLimits struct {
	MaxDepth      int     `json:"max_depth"`      // causal depth of observer commands
	Quota         int     `json:"quota"`          // observer commands per session per window
	WindowSeconds float64 `json:"window_seconds"` //
}

// ReplayRequest asks for an observer's events to be delivered again, to the
// active release's handler, with fake effects (POST
// /v1/sessions/{session}/hooks/replay).
type ReplayRequest struct {
	Handler string `json:"handler"`
	From    int64  `json:"from,omitempty"` // observer event ids, inclusive; 0: from the first
	To      int64  `json:"to,omitempty"`   // 0: to the last
}

// Replayed is one event a replay delivered: the handler's answer, never
// carried out.
type Replayed struct {
	Event    int64             `json:"event"`
	Kind     string            `json:"kind"`
	Commands []json.RawMessage `json:"commands"`
	State    json.RawMessage   `json:"state,omitempty"`
	Problem  string            `json:"problem,omitempty"`
}

// Replay is a replay's answer. Effects is always "fake": nothing was
// acknowledged, written or carried out.
type Replay struct {
	Session string     `json:"session"`
	Handler string     `json:"handler"`
	Effects string     `json:"effects"`
	Events  []Replayed `json:"events"`
}
