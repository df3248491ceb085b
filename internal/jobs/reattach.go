package jobs

import (
	"context"
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
	if _, release, err := m.cfg.Hosts.Reserve(host); err == nil {
		defer release() // the host's slot, so that max_jobs counts this unit
	}
	for attempt := int64(1); ; attempt++ {
		states, err := m.cfg.Hosts.State(ctx, host, unit)
		if err == nil {
			st := states[0]
			if !st.Exists() {
				return m.lost(r, fmt.Sprintf("the unit %s is gone from host %s (a reboot, or it was collected by hand)", unit, host),
					"its unit is gone from host "+host)
			}
			m.cfg.Log.Info("jobs: reattached to a unit on a host", "job", j.ID, "host", host, "unit", unit, "state", st.ActiveState)
			if st.Ended() {
				return m.remoteEnd(r, host, unit, st, started, "")
			}
			return m.watchRemote(ctx, r, host, unit, started)
		}
		if errors.Is(err, hosts.ErrUnknownHost) {
			return m.lost(r, fmt.Sprintf("host %s is no longer in klbr.toml", host), "its host "+host+" is no longer configured")
		}
		m.cfg.Log.Warn("jobs: cannot reach the host of a running job; asking again", "job", j.ID, "host", host, "error", err)
		if !m.sleep(ctx, backoff(attempt)) {
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
