package api

import (
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
