package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/diskuse"
)

// How often the bounded data directory is measured again, and how soon
// after a collection past warn_at the next one may run by itself.
const (
	boundRefresh = 10 * time.Second
	autoGCEvery  = time.Minute
)

// gcRunner runs garbage collection while klbr-core serves, one at a time:
// `klbr-core gc` through the operator API, and the daemon by itself past
// [storage] warn_at.
type gcRunner struct {
	mu sync.Mutex // held for a whole collection
}

// GC implements localapi.Collector: one online collection under
// [retention], artifacts first, each removal in its own transaction.
func (d *daemon) GC(ctx context.Context) (datadir.GCResult, error) {
	d.gc.mu.Lock()
	defer d.gc.mu.Unlock()
	var arts *artifacts.Store
	if d.bench != nil {
		arts = d.bench.Config().Artifacts
	}
	if arts == nil {
		a, err := artifacts.New(d.cfg.Paths.DataDir + "/artifacts")
		if err != nil {
			return datadir.GCResult{}, fmt.Errorf("gc: %w", err)
		}
		arts = a
	}
	// The [retention] in force: a reload changes it for the next run.
	d.reloadMu.Lock()
	retention := d.file.Retention
	d.reloadMu.Unlock()
	res, err := datadir.Collect(ctx, d.store, retention, d.clock(), datadir.GCOptions{Artifacts: arts, Freed: d.disk.Removed})
	d.disk.Refresh()
	return res, err
}

// StorageUsage is the data directory's usage against its bound.
func (d *daemon) StorageUsage() diskuse.Usage { return d.disk.Usage() }

// watchBound measures a bounded data directory every boundRefresh and
// collects by itself once usage passes warn_at (at most every autoGCEvery).
func (d *daemon) watchBound(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if d.cfg.File.Storage.MaxBytes == 0 {
		return cancel
	}
	wg.Go(func() {
		t := time.NewTicker(boundRefresh)
		defer t.Stop()
		var last time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-d.disk.Crossed():
			}
			u := d.disk.Refresh()
			if !u.Warn || (!last.IsZero() && time.Since(last) < autoGCEvery) {
				continue
			}
			last = time.Now()
			res, err := d.GC(ctx)
			after := d.disk.Usage()
			if err != nil {
				d.log.Error("storage past warn_at: gc failed", "used_bytes", u.Used, "max_bytes", u.Max, "error", err)
				continue
			}
			lvl := d.log.Info
			if after.Warn {
				lvl = d.log.Warn // retention allows no more: the operator decides
			}
			lvl("storage past warn_at: gc ran", "removed", len(res.Removed), "freed_bytes", res.Bytes,
				"used_bytes", after.Used, "max_bytes", after.Max, "headroom_bytes", after.Headroom)
		}
	})
	return func() { cancel(); wg.Wait() }
}
