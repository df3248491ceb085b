package hooks

import (
	"context"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// recorder writes invocation records off the caller's path: a step's hooks
// do not each wait for a synced commit of their record. Records are written
// in batches, in order, within moments; Flush waits for those queued, and
// Close writes the rest.
type recorder struct {
	mu     sync.RWMutex // guards closed against sends on a closed channel
	closed bool
	ch     chan recItem
	done   chan struct{}
}

type recItem struct {
	rec   store.HookInvocation
	flush chan struct{} // set: a Flush marker, closed once what came before is written
}

func (d *Dispatcher) startRecorder() {
	d.rec = &recorder{ch: make(chan recItem, 4096), done: make(chan struct{})}
	go d.recordLoop()
}

func (d *Dispatcher) recordLoop() {
	defer close(d.rec.done)
	for first := range d.rec.ch {
		batch := []recItem{first}
	more:
		for len(batch) < 256 {
			select {
			case it, ok := <-d.rec.ch:
				if !ok {
					break more
				}
				batch = append(batch, it)
			default:
				break more
			}
		}
		var recs []store.HookInvocation
		var flushes []chan struct{}
		for _, it := range batch {
			if it.flush != nil {
				flushes = append(flushes, it.flush)
			} else {
				recs = append(recs, it.rec)
			}
		}
		if len(recs) > 0 {
			d.write(recs)
		}
		for _, f := range flushes {
			close(f)
		}
	}
}

func (d *Dispatcher) write(recs []store.HookInvocation) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var slots []string
	for _, r := range recs {
		slots = d.seenSlots(r.Slot)
	}
	n := int64(len(recs))
	after := d.recorded.Add(n)
	prune := after/pruneEvery != (after-n)/pruneEvery // every pruneEvery records
	if err := d.cfg.Store.Write(ctx, func(tx *store.Tx) error {
		for _, r := range recs {
			if err := tx.RecordHookInvocation(r); err != nil {
				return err
			}
		}
		if prune {
			// Inputs are kept for replay: the newest KeepInputs of each slot.
			_, err := tx.PruneHookInputs(slots, KeepInputs)
			return err
		}
		return nil
	}); err != nil {
		d.cfg.Log.Error("hooks: record invocations", "records", len(recs), "error", err)
	}
}

// record queues an invocation's record (written synchronously when the
// queue is full or closed).
func (d *Dispatcher) record(r store.HookInvocation) {
	d.rec.mu.RLock()
	if !d.rec.closed {
		select {
		case d.rec.ch <- recItem{rec: r}:
			d.rec.mu.RUnlock()
			return
		default:
		}
	}
	d.rec.mu.RUnlock()
	d.write([]store.HookInvocation{r})
}

// Flush waits until every invocation finished so far is recorded.
func (d *Dispatcher) Flush() {
	f := make(chan struct{})
	d.rec.mu.RLock()
	if d.rec.closed {
		d.rec.mu.RUnlock()
		return
	}
	d.rec.ch <- recItem{flush: f}
	d.rec.mu.RUnlock()
	<-f
}

// closeRecorder writes what is queued and stops the recorder.
func (d *Dispatcher) closeRecorder() {
	d.rec.mu.Lock()
	if d.rec.closed {
		d.rec.mu.Unlock()
		return
	}
	d.rec.closed = true
	close(d.rec.ch)
	d.rec.mu.Unlock()
	<-d.rec.done
}
