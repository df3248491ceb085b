package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// drainReportEvery is how often a drain that still waits for running cells
// says which ones, so an operator who pressed Ctrl-C sees why klbr-core has
// not exited yet.
const drainReportEvery = 5 * time.Second

// awaitAccepted waits until the accepted work of every session has finished
// and recorded its outcome, or ctx ends. While cells run it logs which, of
// which session, and how long it waits at most, at once and then every
// drainReportEvery. stopNow (a second Ctrl-C) interrupts the running cells:
// each records its outcome (interrupted) and the wait ends promptly.
func (d *daemon) awaitAccepted(ctx context.Context, stopNow <-chan struct{}) error {
	waited := make(chan error, 1)
	go func() { waited <- d.sessions.Shutdown(ctx) }()
	report := time.NewTimer(0)
	defer report.Stop()
	stopping := false
	for {
		select {
		case err := <-waited:
			return err
		case <-stopNow:
			stopNow = nil // a closed channel stays ready
			if stopping {
				continue
			}
			stopping = true
			n := 0
			if d.bench != nil {
				n = len(d.bench.Running())
				d.bench.InterruptAll()
			}
			d.log.Warn("second interrupt: stopping now: running cells are interrupted and recorded as interrupted; "+
				"admitted inputs stay pending for the next start", "interrupted_cells", n)
		case <-report.C:
			d.reportWaiting(ctx, stopping)
			report.Reset(drainReportEvery)
		}
	}
}

// reportWaiting logs what the drain waits for. It says nothing when no cell
// runs: the wait is then about to end.
func (d *daemon) reportWaiting(ctx context.Context, stopping bool) {
	if d.bench == nil {
		return
	}
	cells := d.bench.Running()
	if len(cells) == 0 {
		return
	}
	now := time.Now()
	deadline, _ := ctx.Deadline()
	var parts []string
	for _, c := range cells {
		end := deadline
		if !c.Deadline.IsZero() && c.Deadline.Before(end) {
			end = c.Deadline
		}
		parts = append(parts, fmt.Sprintf("cell x%d of session %s (running %s, at most %s more)",
			c.Execution, c.Session, now.Sub(c.Started).Round(time.Second), max(end.Sub(now), 0).Round(time.Second)))
	}
	if stopping {
		d.log.Warn("stopping: waiting for interrupted cells to record their outcome", "cells", strings.Join(parts, "; "))
		return
	}
	d.log.Warn("draining: waiting for "+plural(len(cells), "running cell")+"; Ctrl-C again stops now (the cells are "+
		"interrupted and recorded as such, admitted inputs are kept)", "cells", strings.Join(parts, "; "))
}
