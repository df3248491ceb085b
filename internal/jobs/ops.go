package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Ops answers the jobs.* host requests of a session's cells.
type Ops struct{ m *Manager }

// NewOps returns the cells' handler of jobs.* requests.
func NewOps(m *Manager) *Ops { return &Ops{m: m} }

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	c := caller{session: workbench.SessionFrom(ctx)}
	if p, ok := workbench.PinFrom(ctx); ok {
		c.release = p.Release
	}
	if c.session == "" {
		return nil, &worker.RequestError{Code: "unsupported", Message: r.Op + " needs a session"}
	}
	if c.release == "" {
		// An operator's cell runs under no attempt's pin: the session's active release.
		if s, err := o.m.cfg.Store.Session(ctx, c.session); err == nil {
			c.release = s.PolicyRevision
		}
	}
	return o.m.handle(ctx, r, c)
}

// caller is who asks: the session, the job asking (0: a cell) and the release.
type caller struct {
	session string
	parent  int64
	release string
}

// MaxWaitSeconds bounds one jobs.wait request; job.result() asks again.
const MaxWaitSeconds = 600

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (m *Manager) handle(ctx context.Context, r worker.Request, c caller) (json.RawMessage, error) {
	switch r.Op {
	case "jobs.run":
		var a struct {
			Argv     []string          `json:"argv"`
			Cwd      string            `json:"cwd"`
			Env      map[string]string `json:"env"`
			Timeout  float64           `json:"timeout"`
			Recovery string            `json:"recovery"`
			Host     string            `json:"host"`
			Inputs   []string          `json:"inputs"`
			Outputs  []string          `json:"outputs"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		if len(a.Host) > 200 {
			return nil, invalid("jobs.run: host= is longer than 200 bytes")
		}
		for k := range a.Env {
			if !envName.MatchString(k) {
				return nil, invalid("jobs.run: %q is not an environment variable name", k)
			}
		}
		if math.IsNaN(a.Timeout) || math.IsInf(a.Timeout, 0) {
			return nil, invalid("jobs.run: timeout must be a number of seconds")
		}
		if a.Host == "" {
			// A session working on a host runs its commands there too.
			var err error
			if a.Host, err = m.hostOf(ctx, c.session); err != nil {
				return nil, &worker.RequestError{Code: "failed", Message: "jobs.run: " + err.Error()}
			}
		}
		root, _, err := m.place(ctx, c.session)
		if err != nil {
			return nil, &worker.RequestError{Code: "failed", Message: "jobs.run: " + err.Error()}
		}
		dir := root
		if a.Host != "" || len(a.Inputs) > 0 || len(a.Outputs) > 0 {
			dir = "" // the job's own directory
		}
		if a.Cwd != "" {
			if dir, err = workbench.Bind(root, a.Cwd); err != nil {
				return nil, invalid("jobs.run: %v", err)
			}
		}
		j, err := m.Run(ctx, RunRequest{Session: c.session, Parent: c.parent, Release: c.release, Recovery: a.Recovery,
			Spec: CommandSpec{Argv: a.Argv, Cwd: dir, Env: a.Env, Timeout: a.Timeout, Host: a.Host, Inputs: a.Inputs, Outputs: a.Outputs}})
		return answer(j, err)
	case "jobs.schedule":
		var a struct {
			Entry    string          `json:"entry"`
			Kind     string          `json:"kind"`
			At       *float64        `json:"at"`    // unix seconds
			Every    *float64        `json:"every"` // seconds
			Cron     string          `json:"cron"`
			TZ       string          `json:"tz"`
			Input    json.RawMessage `json:"input"`
			Recovery string          `json:"recovery"`
			Host     string          `json:"host"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		if len(a.Host) > 200 {
			return nil, invalid("jobs.schedule: host= is longer than 200 bytes")
		}
		var s Schedule
		if a.At != nil {
			if math.IsNaN(*a.At) || *a.At <= 0 || *a.At > 1e11 {
				return nil, invalid("jobs.schedule: at= must be a Unix time or an aware datetime")
			}
			s.At = int64(math.Round(*a.At * 1000))
		}
		if a.Every != nil {
			if math.IsNaN(*a.Every) || *a.Every <= 0 || *a.Every > 366*86400 {
				return nil, invalid("jobs.schedule: every= must be between 1 second and a year")
			}
			s.Every = int64(math.Round(*a.Every * 1000))
		}
		s.Cron = a.Cron
		if len(a.Input) == 0 || string(a.Input) == "null" {
			a.Input = nil
		}
		j, err := m.Schedule(ctx, ScheduleRequest{Session: c.session, Parent: c.parent, Release: c.release, Kind: a.Kind,
			Entry: a.Entry, Input: a.Input, Schedule: s, TZ: a.TZ, Recovery: a.Recovery, Host: a.Host})
		return answer(j, err)
	case "jobs.get":
		j, err := m.own(ctx, r, c)
		return answer(j, err)
	case "jobs.list":
		var a struct {
			State string `json:"state"`
			Limit int    `json:"limit"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		switch store.JobState(a.State) {
		case "", store.JobPending, store.JobRunning, store.JobSucceeded, store.JobFailed, store.JobCancelled, store.JobUnknown:
		default:
			return nil, invalid("jobs.list: %q is not a job state", a.State)
		}
		js, err := m.cfg.Store.Jobs(ctx, store.JobFilter{Session: c.session, State: store.JobState(a.State), Limit: a.Limit})
		if err != nil {
			return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
		}
		return mustJSON(map[string]any{"jobs": js}), nil
	case "jobs.cancel":
		j, err := m.own(ctx, r, c)
		if err != nil {
			return answer(j, err)
		}
		j, err = m.Cancel(ctx, j.ID)
		return answer(j, err)
	case "jobs.wait":
		var a struct {
			ID      int64   `json:"id"`
			Since   int64   `json:"since"`
			Timeout float64 `json:"timeout"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		if math.IsNaN(a.Timeout) || a.Timeout <= 0 || a.Timeout > MaxWaitSeconds {
			a.Timeout = MaxWaitSeconds
		}
		j, err := m.own(ctx, r, c)
		if err != nil {
			return answer(j, err)
		}
		j, err = m.Wait(ctx, j.ID, a.Since, time.Duration(a.Timeout*float64(time.Second)))
		return answer(j, err)
	}
	return nil, &worker.RequestError{Code: "unsupported", Message: fmt.Sprintf("%s is not served here", r.Op)}
}

// own reads the job a request names, if it belongs to the caller's session.
func (m *Manager) own(ctx context.Context, r worker.Request, c caller) (store.Job, error) {
	var a struct {
		ID int64 `json:"id"`
	}
	if err := decode(r, &a); err != nil {
		return store.Job{}, err
	}
	j, err := m.cfg.Store.Job(ctx, a.ID)
	if err == nil && j.Session != c.session {
		return store.Job{}, fmt.Errorf("%w: %d", store.ErrNoJob, a.ID)
	}
	return j, err
}

func answer(j store.Job, err error) (json.RawMessage, error) {
	var re *worker.RequestError
	switch {
	case err == nil:
		return mustJSON(j), nil
	case errors.As(err, &re):
		return nil, err
	case errors.Is(err, store.ErrNoJob):
		return nil, &worker.RequestError{Code: "not_found", Message: err.Error()}
	case errors.Is(err, ErrRefused):
		return nil, &worker.RequestError{Code: "refused", Message: err.Error()}
	case errors.Is(err, store.ErrJobState):
		return nil, &worker.RequestError{Code: "state", Message: err.Error()}
	default:
		return nil, &worker.RequestError{Code: "invalid", Message: err.Error()}
	}
}

// MaxArgs bounds a jobs request's arguments.
const MaxArgs = 256 << 10

func decode(r worker.Request, v any) error {
	if len(r.Args) > MaxArgs {
		return invalid("%s: arguments larger than %d bytes", r.Op, MaxArgs)
	}
	if len(r.Args) == 0 {
		return nil
	}
	if err := json.Unmarshal(r.Args, v); err != nil {
		return invalid("%s: %v", r.Op, err)
	}
	return nil
}

func invalid(format string, a ...any) error {
	return &worker.RequestError{Code: "invalid", Message: fmt.Sprintf(format, a...)}
}
