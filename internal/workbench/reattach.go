package workbench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// reattachTimeout bounds one session's reattach after a restart: listing
// its units, and the handshake of a new epoch (which may wait for the dead
// klbr-core's connection to time out on the host).
const reattachTimeout = 90 * time.Second

// remoteSession is a session whose workbench runs on a host.
type remoteSession struct {
	id  string
	gen int64 // the store's current generation
	r   *Remote
	ws  string // a child's copy on the host; "" for a root session
	b   *bench
}

// ReattachRemote takes back, after klbr-core restarted, the workbench
// generations on hosts that outlived its predecessor (a kill: `klbr-core
// stop` stops them; see docs/hosts.md). For each session whose workbench
// runs on a host (the root's with [agent] host, a running child's on its
// host) it lists the session's worker units there, by name:
// klbr-workbench-<session>-<generation>.service. The unit of the store's
// current generation, when the store does not say it ended, is reattached
// (worker.Reattach: a new epoch of its stream, its hello checked) and
// becomes the session's worker, with its Python state; every older unit of
// the session, and the current one when it ended, is stopped. A generation
// that cannot be reattached is stopped too, and the session is told, as
// for a workbench lost between cells, before its next cell.
//
// Each session's turn is taken here, before ReattachRemote returns, and
// given back when its reattach is over (in the background): no cell can
// start a new generation meanwhile, so a generation is never attached
// twice, nor attached beside a newer one.
func (m *Manager) ReattachRemote(ctx context.Context) error {
	if m.cfg.Remote == nil && m.cfg.Hosts == nil {
		return nil
	}
	sessions, err := m.cfg.Store.Sessions(ctx)
	if err != nil {
		return fmt.Errorf("reattach: %w", err)
	}
	var todo []remoteSession
	for _, s := range sessions {
		if s.KernelGen == 0 {
			continue
		}
		rs := remoteSession{id: s.ID, gen: s.KernelGen}
		if m.remoteFor(s.ID) {
			rs.r = m.cfg.Remote
		} else if s.State == store.StateStopped {
			// An ended child: its last generation was reset when it
			// ended; a unit a kill left behind ends with its grace.
			continue
		} else if p, onHost, err := m.hostPlace(ctx, s.ID); err != nil || !onHost {
			continue
		} else if rs.r, err = m.remoteOn(p.Host); err != nil {
			m.cfg.Log.Warn("workbench: a child's host is gone; its workbench is not reattached", "session", s.ID, "error", err)
			continue
		} else {
			rs.ws = p.Dir
		}
		if rs.b, err = m.bench(s.ID); err != nil {
			for _, rs := range todo {
				rs.b.give()
			}
			return err
		}
		select {
		case rs.b.turn <- struct{}{}:
			todo = append(todo, rs)
		default: // a cell holds it already: it has its generation
		}
	}
	for _, rs := range todo {
		go func() {
			defer rs.b.give()
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reattachTimeout)
			defer cancel()
			m.reattachOne(ctx, rs)
		}()
	}
	return nil
}

// reattachOne reattaches rs's current generation, if it runs on its host,
// and stops every other unit of the session there; rs's turn is held.
func (m *Manager) reattachOne(ctx context.Context, rs remoteSession) {
	r := rs.r
	log := m.cfg.Log.With("session", rs.id, "host", r.Host, "generation", rs.gen)
	ended, err := m.cfg.Store.KernelGenerationEnded(ctx, rs.id, rs.gen)
	if err != nil {
		log.Warn("workbench: reattach: the store cannot say whether the generation ended; not reattached", "error", err)
		return
	}
	prefix := strings.TrimSuffix(hosts.WorkerUnitName(worker.RoleWorkbench, rs.id, 0), "0.service")
	units, err := r.Hosts.Units(ctx, r.Host, prefix)
	if err != nil {
		// Its kernel there ends the generation after the host's down
		// grace; the next cell starts a new one.
		log.Warn("workbench: reattach: the host does not answer; the workbench there is not reattached", "error", err)
		return
	}
	var live string
	for _, u := range units {
		gen, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(u.Unit, prefix), ".service"), 10, 64)
		if err != nil || hosts.WorkerUnitName(worker.RoleWorkbench, rs.id, gen) != u.Unit {
			continue // another session's (its name only begins like this one's)
		}
		if gen > rs.gen {
			continue // started since the store was read (a prepared generation): not ours to judge
		}
		if gen == rs.gen && !ended && u.Active == "active" && live == "" {
			live = u.Unit
			continue
		}
		why := "an older generation"
		if gen == rs.gen {
			why = "the store says it ended"
		}
		log.Info("workbench: stopping a worker unit left on the host", "unit", u.Unit, "why", why)
		if err := r.Hosts.Collect(ctx, r.Host, u.Unit); err != nil {
			log.Warn("workbench: stop a worker unit left on the host", "unit", u.Unit, "error", err)
		}
	}
	if live == "" {
		return
	}
	spec := worker.Spec{Role: worker.RoleWorkbench, Session: rs.id, Generation: rs.gen, Workspace: rs.ws,
		Artifacts: m.cfg.Artifacts, Log: m.cfg.Log, Remote: r.unit(worker.RoleWorkbench, rs.id, rs.gen, rs.ws)}
	w, err := worker.Reattach(ctx, spec)
	if err != nil {
		// Reattach stopped the unit: its Python state is gone.
		reason := fmt.Sprintf("the workbench on host %s (generation %d) could not be reattached after klbr-core restarted: %s. "+
			"Its Python state (variables, imports) is gone; a new generation starts for the next cell",
			r.Host, rs.gen, strings.ToValidUTF8(err.Error(), "?"))
		log.Warn("workbench: reattach failed; a new generation starts for the next cell", "error", err)
		if m.remoteFor(rs.id) {
			r.noteLost(rs.id, rs.gen, reason)
		}
		if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.KernelReset(rs.id, rs.gen, reason) }); err != nil {
			log.Warn("workbench: record the lost generation", "error", err)
		}
		return
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		w.Stop()
		return
	}
	rs.b.w, rs.b.started = w, time.Now()
	log.Info("workbench: reattached the generation on the host after a restart; its Python state is kept", "pid", w.Hello().PID)
}
