package turn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Children fill all but one slot and wait for more; a root still gets the
// last one at once, and a freed slot goes to a waiting root before the
// waiting children.
func TestSlotsKeepOneForRoots(t *testing.T) {
	s := NewSlots(3)
	ctx := context.Background()
	var kids []func()
	for range 2 {
		r, err := s.Acquire(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, r)
	}
	third := make(chan func(), 1)
	go func() {
		r, err := s.Acquire(ctx, true)
		if err != nil {
			t.Error(err)
		}
		third <- r
	}()
	waitFor(t, func() bool { return s.Stats().WaitingChildren == 1 })
	root, err := s.Acquire(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Roots != 1 || st.Children != 2 || st.WaitingChildren != 1 || st.ChildrenWaited != 1 {
		t.Fatalf("stats %+v", st)
	}
	// All three slots are held: a second root waits, and is served first.
	second := make(chan func(), 1)
	go func() {
		r, err := s.Acquire(ctx, false)
		if err != nil {
			t.Error(err)
		}
		second <- r
	}()
	waitFor(t, func() bool { return s.Stats().WaitingRoots == 1 })
	kids[0]()
	kids[0]() // a second release does nothing
	r2 := <-second
	select {
	case <-third:
		t.Fatal("a child took the slot a root waited for")
	case <-time.After(20 * time.Millisecond):
	}
	root()
	r2()
	r3 := <-third
	if st := s.Stats(); st.Roots != 0 || st.Children != 2 || st.WaitingChildren != 0 {
		t.Fatalf("stats %+v", st)
	}
	kids[1]()
	r3()
	if st := s.Stats(); st.Roots+st.Children != 0 {
		t.Fatalf("stats %+v after every release", st)
	}
}

// A waiter whose context ends leaves the queue and holds nothing.
func TestSlotsWaitEndsWithContext(t *testing.T) {
	s := NewSlots(2)
	r, err := s.Acquire(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := s.Acquire(ctx, true); errc <- err }()
	waitFor(t, func() bool { return s.Stats().WaitingChildren == 1 })
	stop := errors.New("the operator stopped the session")
	cancel(stop)
	if err := <-errc; !errors.Is(err, stop) {
		t.Fatalf("err %v, want the cause", err)
	}
	r()
	if st := s.Stats(); st.Children != 0 || st.WaitingChildren != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Under load (run with -race): children never hold more than size-1 slots,
// nothing holds more than size, and every request is served.
func TestSlotsUnderLoad(t *testing.T) {
	const size = 4
	s := NewSlots(size)
	var kids, all, maxKids, maxAll atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		child := i%5 != 0
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*time.Millisecond+time.Millisecond)
			defer cancel()
			if i%3 == 0 {
				ctx = context.Background()
			}
			r, err := s.Acquire(ctx, child)
			if err != nil {
				return
			}
			n := all.Add(1)
			for m := maxAll.Load(); n > m && !maxAll.CompareAndSwap(m, n); m = maxAll.Load() {
			}
			if child {
				k := kids.Add(1)
				for m := maxKids.Load(); k > m && !maxKids.CompareAndSwap(m, k); m = maxKids.Load() {
				}
			}
			time.Sleep(time.Duration(i%3) * time.Millisecond)
			if child {
				kids.Add(-1)
			}
			all.Add(-1)
			r()
		})
	}
	wg.Wait()
	if maxKids.Load() > size-1 || maxAll.Load() > size {
		t.Fatalf("children held %d, all %d (size %d)", maxKids.Load(), maxAll.Load(), size)
	}
	if st := s.Stats(); st.Roots+st.Children+st.WaitingRoots+st.WaitingChildren != 0 {
		t.Fatalf("left over %+v", st)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}
