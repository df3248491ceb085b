package turn

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Slots bounds the model requests in flight at once: Size in all, of which
// child agents hold at most Size-1, so that one is always free for a root
// ([agents] model_slots). A freed slot goes to a waiting root first, then
// to the children in the order they asked.
type Slots struct {
	mu             sync.Mutex
	size           int
	roots, kids    int // in use
	rootQ, childQ  []chan struct{}
	waitedChildren int64 // children that had to wait, since start
}

// SlotStats is what the slots are doing now (metrics, status).
type SlotStats struct {
	Size            int
	Roots, Children int // slots in use
	WaitingRoots    int
	WaitingChildren int
	ChildrenWaited  int64 // child requests that had to wait for a slot, since start
}

// NewSlots returns slots of size (at least 2: one for roots, one for children).
func NewSlots(size int) *Slots {
	return &Slots{size: max(size, 2)}
}

func (s *Slots) free(child bool) bool {
	if s.roots+s.kids >= s.size {
		return false
	}
	return !child || s.kids < s.size-1
}

// Acquire takes a slot for one model request, waiting while none is free
// for its kind; release gives it back (once; later calls do nothing). It
// returns ctx's error if ctx ends first.
func (s *Slots) Acquire(ctx context.Context, child bool) (release func(), err error) {
	s.mu.Lock()
	ahead := len(s.rootQ) > 0 || child && len(s.childQ) > 0
	if !ahead && s.free(child) {
		s.take(child)
		s.mu.Unlock()
		return s.releaser(child), nil
	}
	ready := make(chan struct{})
	if child {
		s.childQ = append(s.childQ, ready)
		s.waitedChildren++
	} else {
		s.rootQ = append(s.rootQ, ready)
	}
	s.mu.Unlock()
	select {
	case <-ready:
		return s.releaser(child), nil
	case <-ctx.Done():
		s.mu.Lock()
		q := &s.rootQ
		if child {
			q = &s.childQ
		}
		if i := slices.Index(*q, ready); i >= 0 {
			*q = slices.Delete(*q, i, i+1)
			s.mu.Unlock()
			return nil, fmt.Errorf("waiting for a model request slot: %w", context.Cause(ctx))
		}
		s.mu.Unlock()
		// Granted as ctx ended: give it back.
		s.releaser(child)()
		return nil, fmt.Errorf("waiting for a model request slot: %w", context.Cause(ctx))
	}
}

func (s *Slots) take(child bool) {
	if child {
		s.kids++
	} else {
		s.roots++
	}
}

func (s *Slots) releaser(child bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if child {
				s.kids--
			} else {
				s.roots--
			}
			s.dispatch()
		})
	}
}

// dispatch hands free slots to the waiting, roots first.
func (s *Slots) dispatch() {
	for len(s.rootQ) > 0 && s.free(false) {
		s.take(false)
		close(s.rootQ[0])
		s.rootQ = s.rootQ[1:]
	}
	for len(s.childQ) > 0 && s.free(true) {
		s.take(true)
		close(s.childQ[0])
		s.childQ = s.childQ[1:]
	}
}

// Stats returns what the slots are doing now.
func (s *Slots) Stats() SlotStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SlotStats{Size: s.size, Roots: s.roots, Children: s.kids, WaitingRoots: len(s.rootQ),
		WaitingChildren: len(s.childQ), ChildrenWaited: s.waitedChildren}
}
