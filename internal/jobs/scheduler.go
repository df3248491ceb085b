package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// dueBatch bounds the due jobs read per wake-up.
const dueBatch = 64

// loop is the scheduler: one timer, armed for the earliest deadline of a
// pending job, and a kick for new jobs and freed slots. Idle, it sleeps
// until that deadline, however many jobs are scheduled.
func (m *Manager) loop() {
	defer close(m.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		wait, ok := m.fire()
		m.mu.Lock()
		if ok {
			m.armed = m.cfg.Clock().Add(wait)
		} else {
			m.armed = time.Time{}
		}
		m.mu.Unlock()
		var tc <-chan time.Time
		if ok {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-m.stop:
			timer.Stop()
			return
		case <-tc:
		case <-m.kick:
			if !timer.Stop() && ok {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		m.wakeups.Add(1)
	}
}

// fire starts the jobs that are due while there are free slots, and says how
// long to sleep until the next deadline (ok is false: no deadline, or every
// slot is taken and a freed slot kicks).
func (m *Manager) fire() (wait time.Duration, ok bool) {
	ctx := context.Background()
	for {
		now := m.cfg.Clock()
		if len(m.slots) == cap(m.slots) {
			return 0, false
		}
		due, err := m.cfg.Store.DueJobs(ctx, now, dueBatch)
		if err != nil {
			m.cfg.Log.Error("jobs: read due jobs", "error", err)
			return 5 * time.Second, true
		}
		started := 0
		for _, j := range due {
			select {
			case m.slots <- struct{}{}:
			default:
				return 0, false
			}
			if m.begin(ctx, j) {
				started++
			} else {
				<-m.slots
			}
		}
		if len(due) == dueBatch && started > 0 {
			continue
		}
		next, any, err := m.cfg.Store.NextDue(ctx)
		if err != nil {
			m.cfg.Log.Error("jobs: read next deadline", "error", err)
			return 5 * time.Second, true
		}
		if !any {
			return 0, false
		}
		if d := next.Sub(m.cfg.Clock()); d > 0 {
			return d, true
		}
		if started == 0 {
			// Due but not startable (a row that moved meanwhile): look again shortly.
			return 100 * time.Millisecond, true
		}
	}
}

// begin moves job j to running and starts its run; false when it was not
// pending any more.
func (m *Manager) begin(ctx context.Context, j store.Job) bool {
	// The move to running and the registration of the run happen under the
	// lock, so that Close either sees the run (and cancels it) or prevents it,
	// and Wait never sees a running row without its run.
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return false
	}
	var runs int64
	err := m.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		runs, err = tx.StartJob(j.ID)
		return err
	})
	if err != nil {
		m.mu.Unlock()
		if !errors.Is(err, store.ErrJobState) {
			m.cfg.Log.Error("jobs: start", "job", j.ID, "error", err)
		}
		return false
	}
	due := time.Now()
	if j.NextDue != nil {
		due = *j.NextDue
	}
	j.State, j.Runs, j.NextDue = store.JobRunning, runs, nil
	rctx, cancel := context.WithTimeout(context.Background(), m.cfg.MaxWall)
	r := &run{job: j, cancel: cancel}
	m.running[j.ID] = r
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		end := m.execute(rctx, r, due)
		m.mu.Lock()
		delete(m.running, j.ID)
		m.mu.Unlock()
		<-m.slots
		if end == nil {
			// Shutting down (the row stays running for the next start to
			// reconcile), deferred, or decided already (a lost remote job).
			m.ended(j.ID)
			m.poke()
			return
		}
		if err := m.writeEnd(*end); err != nil {
			m.cfg.Log.Error("jobs: record end", "job", j.ID, "error", err)
		} else if r.after != nil {
			r.after()
		}
		m.ended(j.ID)
		m.poke()
	}()
	return true
}

// writeEnd records a run's end, retrying while the storage fails.
func (m *Manager) writeEnd(e store.JobEnd) error {
	wait := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.EndJob(e) })
		cancel()
		if !errors.Is(err, store.ErrStorage) {
			return err
		}
		select {
		case <-m.stop:
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// execute runs one run of r's job and says how it ended (nil: cut off by
// shutdown, nothing to record).
func (m *Manager) execute(ctx context.Context, r *run, due time.Time) *store.JobEnd {
	if m.execHook != nil {
		return m.execHook(ctx, r.job, due)
	}
	switch r.job.Kind {
	case KindCommand:
		return m.runCommand(ctx, r)
	case KindRoutine, KindSource:
		return m.runRoutine(ctx, r, due)
	default:
		return &store.JobEnd{ID: r.job.ID, To: store.JobFailed, Error: fmt.Sprintf("jobs of kind %s cannot run yet", r.job.Kind),
			Notice: fmt.Sprintf("[klbr] job %d failed: jobs of kind %s cannot run yet.", r.job.ID, r.job.Kind)}
	}
}

// submit admits a new job through job.plan and stores it pending; the
// scheduler starts it when it is due and a slot is free.
func (m *Manager) submit(ctx context.Context, nj store.NewJob) (store.Job, error) {
	m.mu.Lock()
	closed := m.closed
	running := len(m.running)
	m.mu.Unlock()
	if closed {
		return store.Job{}, ErrClosed
	}
	if m.cfg.Plan != nil {
		p := m.cfg.Plan(ctx, nj.Session, PlanInput{Kind: nj.Kind, Spec: nj.Spec, Schedule: nj.Schedule, Recovery: nj.Recovery, Running: running})
		if !p.Admit {
			return store.Job{}, fmt.Errorf("%w by job.plan: %s", ErrRefused, p.Reason)
		}
		nj.Priority = p.Priority
		if p.Host != nil {
			if err := m.planHost(&nj, *p.Host); err != nil {
				return store.Job{}, err
			}
		}
	}
	var id int64
	if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		id, err = tx.InsertJob(nj)
		return err
	}); err != nil {
		return store.Job{}, err
	}
	m.poke()
	return m.cfg.Store.Job(ctx, id)
}

// Submit stores a job built elsewhere (the operator path, tests).
func (m *Manager) Submit(ctx context.Context, nj store.NewJob) (store.Job, error) {
	return m.submit(ctx, nj)
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
