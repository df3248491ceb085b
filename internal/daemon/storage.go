package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// Storage probe backoff: a fault is probed first after probeFirst, then at
// doubling intervals up to probeMax.
const (
	probeFirst = 500 * time.Millisecond
	probeMax   = 30 * time.Second
)

// watchStorage probes the store while a storage fault is in force (a full
// disk, an I/O error, a read-only file system), with backoff, until a write
// succeeds; then every session gets a durable `storage` notice that says
// what happened. New work waits meanwhile (the turn loop looks at
// Store.Fault); status, the browser and /metrics show the fault.
func (d *daemon) watchStorage(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		wait := probeFirst / 2
		var recoveredAt time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.store.FaultBegan():
			}
			f := d.store.Fault()
			if f == nil {
				continue
			}
			// A fault soon after a recovery (a disk that fills again at
			// once) goes on with the backoff it had, so a flapping disk is
			// probed less and less often; a recovery that held resets it.
			if time.Since(recoveredAt) > probeMax {
				wait = probeFirst / 2
			}
			wait = min(2*wait, probeMax)
			t := time.NewTimer(wait)
			for d.store.Fault() != nil {
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				if err := d.store.Probe(ctx); err != nil {
					wait = min(2*wait, probeMax)
					t.Reset(wait)
					d.log.Warn("storage still failing", "next_probe_in", wait, "error", err)
				}
			}
			t.Stop()
			recoveredAt = time.Now()
			d.storageRecovered(ctx, f)
		}
	})
	return func() { cancel(); wg.Wait() }
}

// storageRecovered records the fault that ended in each session.
func (d *daemon) storageRecovered(ctx context.Context, f *store.Fault) {
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		d.log.Error("storage recovered; the sessions cannot be listed for its notice", "error", err)
		return
	}
	now := d.clock()
	err = d.store.Write(ctx, func(tx *store.Tx) error {
		for _, s := range sessions {
			if _, err := tx.Notice(s.ID, "storage", map[string]any{"state": "recovered", "reason": f.Reason,
				"since": f.Since, "until": now, "lasted_ms": now.Sub(f.Since).Milliseconds(),
				"message": "writes failed, so new work waited and nothing was acknowledged meanwhile; writes succeed again and work goes on"}, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		d.log.Error("storage recovered; its notice could not be written", "error", err)
	}
}
