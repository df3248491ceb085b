package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
)

// reattach takes over a command found running at start whose attempt was
// dispatched to a worker host: its unit is asked for by name, and waited
// on if it exists (never started again); a unit that is gone goes by the
// recovery policy (manual: unknown). A host that does not answer is asked
// again with backoff until the job's wall time has passed since it
// started; then the policy decides as well.
func (m *Manager) reattach(j store.Job) {
	deadline := m.cfg.Clock().Add(m.cfg.MaxWall)
	if j.StartedAt != nil {
		deadline = j.StartedAt.Add(m.cfg.MaxWall)
	}
	rctx, cancel := context.WithDeadline(context.Background(), deadline)
	r := &run{job: j, cancel: cancel}
	m.mu.Lock()
	m.running[j.ID] = r
	m.mu.Unlock()
	// The attempt holds a slot like any running job, when one is free: it
	// runs whether or not one is.
	slot := false
	select {
	case m.slots <- struct{}{}:
		slot = true
	default:
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		end := m.reattachRun(rctx, r)
		m.mu.Lock()
		delete(m.running, j.ID)
		m.mu.Unlock()
		if slot {
			<-m.slots
		}
		if end != nil {
			if err := m.writeEnd(*end); err != nil {
				m.cfg.Log.Error("jobs: record end", "job", j.ID, "error", err)
			} else if r.after != nil {
				r.after()
			}
		}
		m.ended(j.ID)
		m.poke()
	}()
}

func (m *Manager) reattachRun(ctx context.Context, r *run) *store.JobEnd {
	j := r.job
	host, unit := j.Host, UnitName(j.ID, j.Runs)
	started := time.Now()
	if j.StartedAt != nil {
		started = *j.StartedAt
	}
	var s CommandSpec
	if err := json.Unmarshal(j.Spec, &s); err != nil {
		return m.lost(r, "unreadable spec: "+err.Error(), "its spec is unreadable")
	}
	if _, release, err := m.cfg.Hosts.Reserve(host); err == nil {
		defer release() // the host's slot, so that max_jobs counts this unit
	}
	var downSince time.Time
	grace := time.Duration(0)
	if h, ok := m.cfg.Hosts.Host(host); ok {
		grace = h.DownGrace
	}
	for attempt := int64(1); ; attempt++ {
		var err error
		// The start may not have reached the host before klbr-core went
		// away: Start asks for the unit by name first, starts it only if no
		// start of it ever reached the host, and says gone if one did and
		// the unit is not there any more.
		u := remoteUnit(j, s)
		if len(s.Inputs) > 0 {
			// A start that had not reached the host needs the inputs
			// there (sent again only if the host lacks them).
			dir, skipped, ierr := m.remoteInputs(ctx, j, s, host)
			var he *hosts.HostError
			if ierr != nil && !errors.As(ierr, &he) && ctx.Err() == nil {
				return m.lost(r, fmt.Sprintf("host %s: %v", host, ierr), "its inputs could not be put on host "+host)
			}
			u.Inputs, r.inputsSkipped = dir, skipped
			err = ierr
		}
		existed := false
		if err == nil {
			existed, err = m.cfg.Hosts.Start(ctx, host, u)
		}
		switch {
		case err == nil:
			if existed {
				m.cfg.Log.Info("jobs: reattached to a unit on a host", "job", j.ID, "host", host, "unit", unit)
			} else {
				m.cfg.Log.Info("jobs: the start had not reached the host; started now", "job", j.ID, "host", host, "unit", unit)
			}
			m.note(r, "")
			return m.watchRemote(ctx, r, host, unit, started)
		case errors.Is(err, hosts.ErrGone):
			return m.lost(r, fmt.Sprintf("the unit %s is gone from host %s (a reboot, or it was collected by hand)", unit, host),
				"its unit is gone from host "+host)
		case errors.Is(err, hosts.ErrUnknownHost):
			return m.lost(r, fmt.Sprintf("host %s is no longer in klbr.toml", host), "its host "+host+" is no longer configured")
		}
		var he *hosts.HostError
		if !errors.As(err, &he) && ctx.Err() == nil {
			return m.lost(r, fmt.Sprintf("host %s: %v", host, err), "its host "+host+" refused it")
		}
		m.cfg.Log.Warn("jobs: cannot reach the host of a running job; asking again", "job", j.ID, "host", host, "error", err)
		if downSince.IsZero() {
			downSince = m.cfg.Clock()
		}
		if grace > 0 && m.cfg.Clock().Sub(downSince) >= grace {
			return m.lost(r, fmt.Sprintf("host %s did not answer for %s (its down_grace_seconds) after klbr-core restarted: %v", host, grace, err),
				"its host "+host+" did not come back")
		}
		m.note(r, waitingNote(ctx, host, err, downSince, grace, j.Recovery))
		wait := backoff(attempt)
		if grace > 0 {
			wait = min(wait, max(grace/4, m.cfg.HostPoll))
		}
		if !m.sleep(ctx, wait) {
			if r.cancelled.Load() || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return m.remoteInterrupted(ctx, r, host, unit, true)
			}
			return m.lost(r, fmt.Sprintf("host %s did not answer within the job's wall time (%s)", host, m.cfg.MaxWall),
				"its host "+host+" did not come back")
		}
	}
}

// lost decides a remote job whose unit cannot be found by its recovery
// policy; the decision is written here, so nothing is left to record.
func (m *Manager) lost(r *run, why, whyShort string) *store.JobEnd {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.reconcile(ctx, r.job, why, whyShort); err != nil {
		m.cfg.Log.Error("jobs: reconcile a lost remote job", "job", r.job.ID, "error", err)
	}
	return nil
}

// sweep collects the units on each of which (by name) of jobs that have ended: a
// klbr-core killed after it recorded a job's end and before it collected
// the unit leaves one (ended, holding only its output) that no run asks for
// any more.
func (m *Manager) sweep(which map[string]bool) {
	for _, host := range m.cfg.Hosts.Names() {
		if !which[host] {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		units, err := m.cfg.Hosts.Units(ctx, host, "klbr-job-")
		cancel()
		if err != nil {
			m.cfg.Log.Warn("jobs: list a host's units", "host", host, "error", err)
			continue
		}
		for _, u := range units {
			var id, attempt int64
			if _, err := fmt.Sscanf(u.Unit, "klbr-job-%d-%d.service", &id, &attempt); err != nil || UnitName(id, attempt) != u.Unit {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			j, err := m.cfg.Store.Job(ctx, id)
			if (err == nil && j.State.Final()) || errors.Is(err, store.ErrNoJob) {
				if err := m.cfg.Hosts.Collect(ctx, host, u.Unit); err != nil {
					m.cfg.Log.Warn("jobs: collect a host's unit", "host", host, "unit", u.Unit, "error", err)
				} else {
					m.cfg.Log.Info("jobs: collected the unit of an ended job", "host", host, "unit", u.Unit)
				}
			}
			cancel()
		}
	}
}
