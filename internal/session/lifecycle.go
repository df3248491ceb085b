// Package session owns the session lifecycle: which state moves are legal,
// the per-session admission gate, and the accounting of accepted work that a
// drain waits for.
package session

import (
	"fmt"
	"slices"

	"github.com/klbr-dev/klbr/internal/store"
)

// transitions is the lifecycle machine. The schema enforces the same table
// (migration 0001, trigger session_transitions); a test keeps them equal.
var transitions = map[store.SessionState][]store.SessionState{
	store.StateReady:   {store.StateRunning, store.StatePaused, store.StateStopped},
	store.StateRunning: {store.StateReady, store.StateWaiting, store.StatePaused, store.StateStopped},
	store.StateWaiting: {store.StateReady, store.StateRunning, store.StatePaused, store.StateStopped},
	store.StatePaused:  {store.StateReady, store.StateStopped},
	store.StateStopped: {store.StateReady},
}

// CheckTransition reports whether a session may move from one state to another.
func CheckTransition(from, to store.SessionState) error {
	if !slices.Contains(transitions[from], to) {
		return fmt.Errorf("%w: %s → %s", store.ErrIllegalTransition, from, to)
	}
	return nil
}
