package daemon

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// EnvSystemdBus is the D-Bus address placement reaches systemd at, to create the workers'
// scopes: e.g. unix:path=/run/systemd/private (systemd's own socket, root only). Unset: the
// system bus ($DBUS_SYSTEM_BUS_ADDRESS or /run/dbus/system_bus_socket).
const EnvSystemdBus = "KLBR_SYSTEMD_BUS"

const (
	// extendEvery is how often a drain that still waits for accepted work tells systemd so
	// (EXTEND_TIMEOUT_USEC=, each granting three periods).
	extendEvery = 5 * time.Second
	// statusRefresh bounds how stale the STATUS= line may get (a session created, …).
	statusRefresh = time.Minute
)

// cellCounter counts the cells running through the operator API, for systemd's STATUS=
// line; it passes everything else through.
type cellCounter struct {
	localapi.Workbench
	running *atomic.Int64
	changed func()
}

func (c cellCounter) Execute(ctx context.Context, session, code string, h worker.Handler) (workbench.Result, error) {
	c.running.Add(1)
	c.changed()
	defer func() {
		c.running.Add(-1)
		c.changed()
	}()
	return c.Workbench.Execute(ctx, session, code, h)
}

// countCells wraps the workbench the operator API runs cells with.
func (d *daemon) countCells(b localapi.Workbench) localapi.Workbench {
	return cellCounter{Workbench: b, running: &d.cellsRunning, changed: d.statusChanged}
}

// statusChanged asks the status reporter for a new STATUS= line; it never blocks.
func (d *daemon) statusChanged() {
	select {
	case d.statusPoke <- struct{}{}:
	default:
	}
}

// serveStatus is the STATUS= line while serving.
func (d *daemon) serveStatus(ctx context.Context) string {
	sessions := "sessions"
	if ss, err := d.store.Sessions(ctx); err == nil {
		sessions = plural(len(ss), "session")
	}
	if d.benchErr != nil {
		return fmt.Sprintf("serving %s; cells cannot run: %v", sessions, d.benchErr)
	}
	mode := "none"
	if d.placer != nil {
		mode = string(d.placer.Mode())
	}
	return fmt.Sprintf("serving %s, %s running (placement: %s)", sessions, plural(int(d.cellsRunning.Load()), "cell"), mode)
}

// drainStatus is the STATUS= line while a drain waits for accepted work.
func (d *daemon) drainStatus() string {
	if n := d.cellsRunning.Load(); n > 0 {
		return "draining: waiting for " + plural(int(n), "running cell")
	}
	return "draining: waiting for accepted work"
}

// startStatus keeps systemd's STATUS= line current until stop is called (at the start of a
// drain, whose lines then take over). Without a service manager it starts nothing.
func (d *daemon) startStatus(ctx context.Context) (stop func()) {
	if !d.notify.Enabled() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(statusRefresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.statusPoke:
			case <-t.C:
			}
			if s := d.serveStatus(ctx); ctx.Err() == nil {
				d.notify.Status(s)
			}
			t.Reset(statusRefresh)
		}
	})
	return func() { cancel(); wg.Wait() }
}

// alive is the watchdog's check: the store answers a read.
func (d *daemon) alive(ctx context.Context) error {
	_, err := d.store.Sessions(ctx)
	return err
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if n == 0 {
		return "no " + word + "s"
	}
	return fmt.Sprintf("%d %ss", n, word)
}
