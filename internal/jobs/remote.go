package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
)

// UnitName is the unit of a job's attempt on a host: its identity there, and
// the key that keeps the attempt from starting twice.
func UnitName(job, attempt int64) string {
	return fmt.Sprintf("klbr-job-%d-%d.service", job, attempt)
}

// maxDeferral bounds the wait before a job whose host could not be reached
// is dispatched again.
const maxDeferral = 5 * time.Minute

// runRemote runs a command job's attempt as a transient unit on a worker
// host. A host that cannot be reached (or has no room) before anything is
// sent puts the job back to pending with the reason, due again after a
// backoff; nothing ran. Once the start went out, the unit's name decides:
// the attempt is watched until it ends, however often the connection
// breaks meanwhile.
func (m *Manager) runRemote(ctx context.Context, r *run, s CommandSpec) *store.JobEnd {
	j := r.job
	fail := func(msg string) *store.JobEnd {
		e := &store.JobEnd{ID: j.ID, To: store.JobFailed, Error: msg}
		e.Notice = commandNotice(j, e, 0)
		return e
	}
	if m.cfg.Hosts == nil {
		return fail(fmt.Sprintf("host %q: klbr.toml defines no [hosts.NAME] any more", s.Host))
	}
	host, release, err := m.cfg.Hosts.Reserve(s.Host)
	if errors.Is(err, hosts.ErrNoRoom) {
		return m.deferRun(j, fmt.Sprintf("waiting for a job slot: %v", err), time.Second)
	}
	if err != nil {
		return fail(err.Error())
	}
	defer func() { release() }()
	unit := UnitName(j.ID, j.Runs)
	u := remoteUnit(j, s)
	started := time.Now()
	// The host is on the row before anything is sent there: a restart asks
	// it for the unit, whatever became of the start.
	if err := m.writePlace(j.ID, host); err != nil {
		return m.deferRun(j, "recording the host: "+err.Error(), backoff(j.Runs))
	}
	// The job runs under the host's klbr-kernel, confined to its own
	// directory (hosts.Unit.Confine), with its inputs copied in.
	if len(s.Inputs) > 0 {
		dir, skipped, err := m.remoteInputs(ctx, j, s, host)
		var he *hosts.HostError
		switch {
		case errors.As(err, &he):
			return m.deferRun(j, err.Error(), backoff(j.Runs)) // nothing runs there yet
		case err != nil && ctx.Err() != nil:
			return m.remoteInterrupted(ctx, r, host, unit, false)
		case err != nil:
			return fail(err.Error())
		}
		r.inputsSkipped = skipped
		u.Inputs = dir
	}
	tried := map[string]bool{}
	for attempt := 0; ; attempt++ {
		tried[host] = true
		_, err = m.cfg.Hosts.Start(ctx, host, u)
		if err == nil {
			break
		}
		if errors.Is(err, hosts.ErrGone) {
			return m.lost(r, fmt.Sprintf("the unit %s was started on host %s and is gone (a reboot, or it was collected by hand)", unit, host),
				"its unit is gone from host "+host)
		}
		if ctx.Err() != nil && !errors.Is(err, hosts.ErrLost) {
			return m.remoteInterrupted(ctx, r, host, unit, false)
		}
		if errors.Is(err, hosts.ErrNoKernel) {
			return fail(err.Error())
		}
		if !errors.Is(err, hosts.ErrLost) {
			var he *hosts.HostError
			if !errors.As(err, &he) {
				return fail(err.Error())
			}
			// Nothing was sent: nothing runs there. A job that asked for a
			// label moves to another host with it that it has not tried.
			if next, nrelease, nerr := m.cfg.Hosts.Reserve(s.Host); nerr == nil && !tried[next] {
				release()
				host, release = next, nrelease
				m.cfg.Log.Warn("jobs: a job's host is unreachable; it moves to another with its label", "job", j.ID, "from", he.Host, "to", host, "error", err)
				if err := m.writePlace(j.ID, host); err != nil {
					return m.deferRun(j, "recording the host: "+err.Error(), backoff(j.Runs))
				}
				continue
			} else if nerr == nil {
				nrelease()
			}
			return m.deferRun(j, err.Error(), backoff(j.Runs))
		}
		// The start went out and its answer was lost: Start again asks
		// whether the unit exists before it starts anything.
		if !m.sleep(ctx, backoff(int64(attempt+1))) {
			return m.remoteInterrupted(ctx, r, host, unit, true)
		}
	}
	m.cfg.Log.Info("jobs: started on a host", "job", j.ID, "host", host, "unit", unit)
	return m.watchRemote(ctx, r, host, unit, started)
}

// remoteUnit is the unit of job j's current attempt.
func remoteUnit(j store.Job, s CommandSpec) hosts.Unit {
	return hosts.Unit{Name: UnitName(j.ID, j.Runs), Description: describe(j), Argv: s.Argv, Env: s.Env,
		Wall: time.Duration(s.Timeout * float64(time.Second)), Confine: true}
}

// remoteInputs packs a job's inputs from its session's workspace and puts
// them on host (content-addressed: sent only when the host lacks them),
// returning their directory there and what of them was left out. An error
// of kind *hosts.HostError means the host was not reached.
func (m *Manager) remoteInputs(ctx context.Context, j store.Job, s CommandSpec, host string) (string, []string, error) {
	root, _, err := m.place(ctx, j.Session)
	if err != nil {
		return "", nil, err
	}
	tree, skipped, err := packInputs(root, s.Inputs)
	if err != nil {
		return "", nil, err
	}
	dir, sent, err := m.cfg.Hosts.PutTree(ctx, host, tree)
	if err != nil {
		var he *hosts.HostError
		if errors.As(err, &he) {
			return "", nil, err
		}
		return "", nil, fmt.Errorf("inputs: %w", err)
	}
	m.cfg.Log.Info("jobs: inputs on the host", "job", j.ID, "host", host, "tree", tree.Hash[:12], "bytes", len(tree.Tar), "sent", sent)
	return dir, skipped, nil
}

// watchRemote waits for a started unit to end, however often the
// connection breaks meanwhile, and says how the job ended. While the host
// does not answer, the job says it waits for the host and what ends the
// wait: the host's down_grace_seconds of silence (or, without one, the
// job's wall time), after which the recovery policy decides.
func (m *Manager) watchRemote(ctx context.Context, r *run, host, unit string, started time.Time) *store.JobEnd {
	j := r.job
	var st hosts.UnitState
	var downSince time.Time
	grace := time.Duration(0)
	if h, ok := m.cfg.Hosts.Host(host); ok {
		grace = h.DownGrace
	}
	for {
		if !m.sleep(ctx, m.cfg.HostPoll) {
			return m.remoteInterrupted(ctx, r, host, unit, true)
		}
		states, err := m.cfg.Hosts.State(ctx, host, unit)
		if err != nil {
			if ctx.Err() != nil {
				return m.remoteInterrupted(ctx, r, host, unit, true)
			}
			now := m.cfg.Clock()
			if downSince.IsZero() {
				downSince = now
				m.cfg.Log.Warn("jobs: the host of a running job does not answer; waiting for it", "job", j.ID, "host", host, "error", err)
			}
			if grace > 0 && now.Sub(downSince) >= grace {
				return m.lost(r, fmt.Sprintf("host %s did not answer for %s (its down_grace_seconds) while the job ran: %v", host, grace, err),
					"its host "+host+" did not come back")
			}
			m.note(r, waitingNote(ctx, host, err, downSince, grace, j.Recovery))
			continue
		}
		if !downSince.IsZero() {
			downSince = time.Time{}
			m.note(r, "")
			m.cfg.Log.Info("jobs: the host answers again; the job's unit is reattached", "job", j.ID, "host", host, "unit", unit, "state", states[0].ActiveState)
		}
		st = states[0]
		if !st.Exists() || st.Ended() {
			break
		}
	}
	return m.remoteEnd(r, host, unit, st, started, "")
}

// waitingNote says that a running job waits for its host, and what ends the
// wait.
func waitingNote(ctx context.Context, host string, err error, since time.Time, grace time.Duration, recovery string) string {
	var until time.Time
	what := "its down_grace_seconds"
	if grace > 0 {
		until = since.Add(grace)
	} else if d, ok := ctx.Deadline(); ok {
		until, what = d, "its wall time"
	}
	policy := "unknown, not run again (recovery manual)"
	if recovery == RetrySafe {
		policy = "run again (recovery retry_safe)"
	}
	s := fmt.Sprintf("waiting for host %s, down since %s (%v); its unit is reattached when the host answers", host,
		since.UTC().Format(time.RFC3339), err)
	if !until.IsZero() {
		s += fmt.Sprintf("; if it does not by %s (%s), the job is %s", until.UTC().Format(time.RFC3339), what, policy)
	}
	return s
}

// note sets what a running job waits for (its error while it runs; ""
// clears it), in the store and in the listing of running jobs.
func (m *Manager) note(r *run, note string) {
	m.mu.Lock()
	same := r.job.Error == note
	r.job.Error = note
	m.mu.Unlock()
	if same {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.NoteJob(r.job.ID, note) }); err != nil {
		m.cfg.Log.Warn("jobs: note on a running job", "job", r.job.ID, "error", err)
	}
}

// remoteEnd reads an ended unit's output, collects the unit, and says how
// the job ended. why, when set, overrides the unit's own outcome (a cancel).
func (m *Manager) remoteEnd(r *run, host, unit string, st hosts.UnitState, started time.Time, why string) *store.JobEnd {
	j := r.job
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &spooler{max: m.cfg.MaxOutput, tailMax: m.cfg.PreviewBytes}
	if m.cfg.Artifacts != nil {
		var err error
		if out.sp, err = m.cfg.Artifacts.NewSpool(); err != nil {
			m.cfg.Log.Warn("jobs: no output artifact", "job", j.ID, "error", err)
		}
	}
	total, oerr := m.cfg.Hosts.Output(ctx, host, unit, m.cfg.MaxOutput, out)
	if oerr != nil {
		m.cfg.Log.Warn("jobs: output of a host's unit", "job", j.ID, "host", host, "error", oerr)
	}
	out.total = max(out.total, total)
	var spec CommandSpec
	_ = json.Unmarshal(j.Spec, &spec)
	var files []store.JobFile
	var outSkipped []string
	if len(spec.Outputs) > 0 && st.Exists() && oerr == nil {
		files, outSkipped, oerr = m.fetchOutputs(ctx, host, unit, spec.Outputs)
		if oerr != nil {
			m.cfg.Log.Warn("jobs: outputs of a host's unit", "job", j.ID, "host", host, "error", oerr)
			outSkipped = append(outSkipped, "not brought back: "+oerr.Error())
		}
	}
	if oerr == nil {
		// Collected once the end is recorded (never before: a restart in
		// between would find neither the end nor the unit).
		r.after = func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := m.cfg.Hosts.Collect(ctx, host, unit); err != nil {
				m.cfg.Log.Warn("jobs: collect a host's unit", "job", j.ID, "host", host, "unit", unit, "error", err)
			}
		}
	}
	took := time.Since(started).Round(time.Millisecond)
	e := &store.JobEnd{ID: j.ID, Preview: out.preview(), OutputBytes: out.total}
	if out.sp != nil {
		if out.err == nil && out.sp.Size() > 0 {
			if ref, cerr := out.sp.Commit(); cerr == nil {
				e.Artifact, e.ArtifactSize = "a"+ref.SHA256, ref.Size
			}
		} else {
			out.sp.Discard()
		}
	}
	code, reason := st.Outcome()
	timedOut := st.Result == "timeout" && code != 0
	result := map[string]any{"exit_code": code, "timed_out": timedOut, "output_bytes": out.total,
		"output_truncated": out.total > m.cfg.MaxOutput, "seconds": took.Seconds(), "host": host, "unit": unit}
	if e.Artifact != "" {
		result["output"] = e.Artifact
	}
	addFiles(result, e, files, outSkipped, r.inputsSkipped)
	e.Result = mustJSON(result)
	switch {
	case why != "":
		e.To, e.Error = store.JobCancelled, why
	case !st.Exists():
		e.To, e.Error = store.JobUnknown, fmt.Sprintf("the unit %s vanished from host %s (a reboot?); its outcome is unknown and it was not run again", unit, host)
	case code == 0:
		e.To = store.JobSucceeded
	default:
		e.To, e.Error = store.JobFailed, fmt.Sprintf("%s (on host %s)", reason, host)
	}
	e.Notice = commandNotice(j, e, took)
	return e
}

// remoteInterrupted ends a run whose context ended: a cancel by the owner
// or the operator, the wall-time limit, or klbr-core stopping. A cancel or
// the wall-time limit stops the unit (its whole control group), so that
// nothing it started is left on the host. klbr-core stopping leaves the
// unit to finish under the host's systemd: the row stays running with its
// host, and the next start reattaches to the unit. sent says whether a
// start may have gone out; when none did, the job is pending again.
func (m *Manager) remoteInterrupted(runCtx context.Context, r *run, host, unit string, sent bool) *store.JobEnd {
	j := r.job
	if !r.cancelled.Load() && !errors.Is(runCtx.Err(), context.DeadlineExceeded) {
		if !sent {
			return m.deferRun(j, "klbr-core stopped before the job was sent to host "+host, 0)
		}
		m.cfg.Log.Info("jobs: klbr-core stops; the job's unit runs on and is reattached at the next start", "job", j.ID, "host", host, "unit", unit)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stopErr error
	if sent {
		if stopErr = m.cfg.Hosts.Stop(ctx, host, unit); stopErr != nil {
			m.cfg.Log.Error("jobs: stop a host's unit", "job", j.ID, "host", host, "unit", unit, "error", stopErr)
		}
	}
	var st hosts.UnitState
	states, serr := m.cfg.Hosts.State(ctx, host, unit)
	if serr == nil {
		st = states[0]
	}
	if sent && serr != nil && !r.cancelled.Load() {
		// Past its wall time with its host silent: nothing is known of the
		// unit (its RuntimeMaxSec has stopped it there by now).
		return m.lost(r, fmt.Sprintf("host %s did not answer by the end of the job's wall time (%s): %v", host, m.cfg.MaxWall, serr),
			"its host "+host+" did not come back")
	}
	switch {
	case r.cancelled.Load() && stopErr != nil:
		return m.remoteEnd(r, host, unit, st, time.Now(), fmt.Sprintf("cancelled; host %s did not answer the stop (%v): its unit may run on there until its wall time", host, stopErr))
	case r.cancelled.Load():
		return m.remoteEnd(r, host, unit, st, time.Now(), "cancelled; its unit and every process of it on the host were stopped")
	case errors.Is(runCtx.Err(), context.DeadlineExceeded):
		e := m.remoteEnd(r, host, unit, st, time.Now(), "")
		e.To, e.Error = store.JobFailed, fmt.Sprintf("ran past the wall-time limit (%s) and was stopped on host %s", m.cfg.MaxWall, host)
		e.Notice = commandNotice(j, e, 0)
		return e
	}
	return nil
}

// deferRun puts the job back to pending, due after wait, with why; nothing
// of it ran.
func (m *Manager) deferRun(j store.Job, why string, wait time.Duration) *store.JobEnd {
	due := m.cfg.Clock().Add(wait)
	reason := fmt.Sprintf("not started: %s; trying again at %s", why, due.UTC().Format(time.RFC3339))
	if err := m.writeDefer(j.ID, reason, due); err != nil {
		m.cfg.Log.Error("jobs: defer", "job", j.ID, "error", err)
	}
	m.cfg.Log.Warn("jobs: a job's host is not ready; the job waits", "job", j.ID, "reason", why, "due", due)
	return nil
}

func (m *Manager) writePlace(id int64, host string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.PlaceJob(id, host) })
}

func (m *Manager) writeDefer(id int64, reason string, due time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.DeferJob(id, reason, due) })
}

// backoff is the wait before the n-th try again: 2 s doubling, at most 5 min.
func backoff(n int64) time.Duration {
	d := 2 * time.Second
	for i := int64(1); i < n && d < maxDeferral; i++ {
		d *= 2
	}
	return min(d, maxDeferral)
}

// sleep waits d unless ctx ends first (false).
func (m *Manager) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// fetchOutputs brings the files of an ended unit's directory that match
// globs back as artifacts, within the bounds of files.go.
func (m *Manager) fetchOutputs(ctx context.Context, host, unit string, globs []string) ([]store.JobFile, []string, error) {
	if m.cfg.Artifacts == nil {
		return nil, []string{"no artifact store here"}, nil
	}
	listed, err := m.cfg.Hosts.ListFiles(ctx, host, unit)
	if err != nil {
		return nil, nil, err
	}
	picked, skipped := selectOutputs(listed, globs)
	names := make([]string, len(picked))
	for i, f := range picked {
		names[i] = f.Path
	}
	var files []store.JobFile
	var budget int64 = MaxOutputsBytes
	err = m.cfg.Hosts.FetchFiles(ctx, host, unit, names, MaxOutputsBytes, func(name string, size int64, r io.Reader) error {
		f, note, err := m.keepFile(name, size, r, &budget)
		if err != nil {
			return err
		}
		if note != "" {
			skipped = append(skipped, note)
		}
		if f.Artifact != "" {
			files = append(files, f)
		}
		return nil
	})
	return files, skipped, err
}
