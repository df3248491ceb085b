package hooks

import (
	"sort"
	"sync"
	"time"
)

// SlotStats are one slot's counts since the daemon started.
type SlotStats struct {
	Slot        string        `json:"slot"`
	Invocations int64         `json:"invocations"`
	Fallbacks   int64         `json:"fallbacks"`
	Failures    int64         `json:"failures"` // outcome other than ok
	Latency     time.Duration `json:"latency_ns"`
	// Skipped counts the times the host applied the default without asking
	// (the release does not bind the slot).
	Skipped int64 `json:"skipped"`
}

// Stats counts invocations per slot.
type Stats struct {
	mu    sync.Mutex
	slots map[string]*SlotStats
}

func newStats() *Stats { return &Stats{slots: map[string]*SlotStats{}} }

func (s *Stats) get(slot string) *SlotStats {
	st := s.slots[slot]
	if st == nil {
		st = &SlotStats{Slot: slot}
		s.slots[slot] = st
	}
	return st
}

func (s *Stats) add(slot, outcome string, fallback bool, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.get(slot)
	st.Invocations++
	st.Latency += latency
	if fallback {
		st.Fallbacks++
	}
	if outcome != "ok" {
		st.Failures++
	}
}

func (s *Stats) skip(slot string) {
	s.mu.Lock()
	s.get(slot).Skipped++
	s.mu.Unlock()
}

// Stats returns every slot's counts (slots never called count zero), by name.
func (d *Dispatcher) Stats() []SlotStats {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	var out []SlotStats
	for _, s := range registry {
		if st := d.stats.slots[s.Name]; st != nil {
			out = append(out, *st)
		} else {
			out = append(out, SlotStats{Slot: s.Name})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out
}
