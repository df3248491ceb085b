package store

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// walBurst admits n inputs from parallel clients while readers read, and
// returns the largest WAL seen (sampled after every write and by a poller).
func walBurst(t testing.TB, s *Store, n, clients int) int64 {
	var largest atomic.Int64
	sample := func() {
		if fi, err := os.Stat(s.walPath()); err == nil {
			for {
				cur := largest.Load()
				if fi.Size() <= cur || largest.CompareAndSwap(cur, fi.Size()) {
					break
				}
			}
		}
	}
	var next atomic.Int64
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 { // readers (status, metrics scrapes, the turn loop) take snapshots meanwhile, every 25 ms
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(25 * time.Millisecond):
				}
				s.PendingStats(context.Background())
				sample()
			}
		})
	}
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				err := s.Write(context.Background(), func(tx *Tx) error {
					_, err := tx.AdmitInput(testInput("default", fmt.Sprintf("k%d", i), "a message of ordinary length, as someone would send it"))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				if i%64 == 0 {
					sample()
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	sample()
	return largest.Load()
}

// TestWALBoundedUnderBurst: the WAL stays under WALBoundBytes during a
// 100,000-input burst from parallel clients with readers active, and the
// idle checkpoint truncates it to nothing once the burst ends.
func TestWALBoundedUnderBurst(t *testing.T) {
	n := 100_000
	if testing.Short() || raceBuild {
		n = 20_000 // the 100,000-input figure: go test -run TestWALBounded (docs/performance.md)
	}
	s := newStore(t)
	largest := walBurst(t, s, n, 32)
	t.Logf("largest WAL during a %d-input burst: %.1f MiB (bound %d MiB); %+v", n, float64(largest)/(1<<20), WALBoundBytes>>20, s.CheckpointStats())
	if largest > WALBoundBytes {
		t.Errorf("the WAL reached %d bytes, past its bound of %d", largest, WALBoundBytes)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fi, err := os.Stat(s.walPath())
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the WAL is still %d bytes 10s after the burst (%+v)", fi.Size(), s.CheckpointStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
