// Package live carries best-effort live events that are not records: the
// token deltas of a model step as it streams. Nothing here is durable and
// nothing waits: a subscriber that falls behind loses deltas, never blocks
// the publisher. The completed records in the store are the truth.
package live

import "sync"

// Delta is one streamed increment of a model step.
type Delta struct {
	Session string `json:"session"`
	Attempt int64  `json:"attempt"`
	Step    int64  `json:"step"` // the step's number within its attempt, as in its scratchpad record
	// Kind is "content" (scratchpad text), "reasoning", "tool" (a tool
	// call's arguments as they stream) or "end" (the step's stream ended;
	// its record follows or has been written).
	Kind string `json:"kind"`
	Text string `json:"text,omitempty"`
	Call string `json:"call,omitempty"` // the tool call id, for kind "tool"
	// Index is the delta's place in its step's stream, from 0; an "end"
	// carries the count. A subscriber that sees an index it did not expect
	// joined mid-stream or lost deltas, and can say so.
	Index int64 `json:"index"`
}

// Buffer is each subscriber's queue length.
const Buffer = 256

// Hub fans deltas out to the subscribers of each session.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan Delta]struct{}
	drop uint64 // deltas dropped for slow subscribers
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[string]map[chan Delta]struct{}{}} }

// Publish hands d to every subscriber of its session that has room.
func (h *Hub) Publish(d Delta) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[d.Session] {
		select {
		case ch <- d:
		default:
			h.drop++
		}
	}
}

// Subscribe returns the deltas of session and a cancel that ends the
// subscription (the channel is not closed; stop reading it after cancel).
func (h *Hub) Subscribe(session string) (<-chan Delta, func()) {
	ch := make(chan Delta, Buffer)
	h.mu.Lock()
	set := h.subs[session]
	if set == nil {
		set = map[chan Delta]struct{}{}
		h.subs[session] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[session], ch)
		if len(h.subs[session]) == 0 {
			delete(h.subs, session)
		}
		h.mu.Unlock()
	}
}

// Dropped reports how many deltas slow subscribers lost.
func (h *Hub) Dropped() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.drop
}
