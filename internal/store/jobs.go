package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// JobState is where a job is in its lifecycle (see internal/jobs).
type JobState string

// Job states. pending → running → succeeded | failed | cancelled | unknown,
// pending → cancelled, and running → pending (a recurring job re-armed, or a
// recovered retry_safe/resume job started again).
const (
	JobPending   JobState = "pending"
	JobRunning   JobState = "running"
	JobSucceeded JobState = "succeeded"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
	JobUnknown   JobState = "unknown"
)

// Final reports whether s is terminal.
func (s JobState) Final() bool {
	switch s {
	case JobSucceeded, JobFailed, JobCancelled, JobUnknown:
		return true
	}
	return false
}

// ErrJobState reports a job move the current state does not allow.
var ErrJobState = errors.New("illegal job transition")

// ErrNoJob is returned for a job id that does not exist.
var ErrNoJob = errors.New("no such job")

// Job is one stored job.
type Job struct {
	ID             int64           `json:"id"`
	Kind           string          `json:"kind"`
	Session        string          `json:"session"`
	Parent         int64           `json:"parent,omitempty"`
	Release        string          `json:"release,omitempty"`
	Workspace      string          `json:"workspace,omitempty"`
	Spec           json.RawMessage `json:"spec"`
	Budget         json.RawMessage `json:"budget"`
	Recovery       string          `json:"recovery"`
	State          JobState        `json:"state"`
	Priority       int             `json:"priority"`
	Schedule       json.RawMessage `json:"schedule,omitempty"`
	TZ             string          `json:"tz"`
	NextDue        *time.Time      `json:"next_due,omitempty"`
	Runs           int64           `json:"runs"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          string          `json:"error,omitempty"`
	OutputArtifact string          `json:"output_artifact,omitempty"`
	OutputPreview  string          `json:"output_preview,omitempty"`
	OutputBytes    int64           `json:"output_bytes,omitempty"`
	Checkpoint     json.RawMessage `json:"checkpoint,omitempty"`
	Cursor         json.RawMessage `json:"cursor,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	StartedAt      *time.Time      `json:"started_at,omitempty"`
	FinishedAt     *time.Time      `json:"finished_at,omitempty"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// Host is the worker host the current attempt was dispatched to; "" here.
	Host string `json:"host,omitempty"`
}

// NewJob is a job to store, pending.
type NewJob struct {
	Kind      string
	Session   string
	Parent    int64
	Release   string
	Workspace string
	Spec      json.RawMessage
	Budget    json.RawMessage // nil means {}
	Recovery  string
	Priority  int
	Schedule  json.RawMessage // nil: run now
	TZ        string          // "" means UTC
	NextDue   time.Time       // zero: due now
}

// InsertJob stores j as pending and returns its id.
func (t *Tx) InsertJob(j NewJob) (int64, error) {
	if _, err := t.sessionState(j.Session); err != nil {
		return 0, err
	}
	budget := j.Budget
	if budget == nil {
		budget = json.RawMessage("{}")
	}
	var sched any
	if j.Schedule != nil {
		sched = string(j.Schedule)
	}
	if j.TZ == "" {
		j.TZ = "UTC"
	}
	due := j.NextDue
	if due.IsZero() {
		due = t.now
	}
	var parent any
	if j.Parent != 0 {
		parent = j.Parent
	}
	res, err := t.exec(`INSERT INTO jobs (kind, session_id, parent_id, release, workspace, spec, budget, recovery, priority,
		schedule, tz, next_due, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		j.Kind, j.Session, parent, j.Release, j.Workspace, string(j.Spec), string(budget), j.Recovery, j.Priority,
		sched, j.TZ, due.UnixMilli(), t.now.UnixMilli(), t.now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("insert job: %w", err)
	}
	return res.LastInsertId()
}

// moveJob is the one place a job's state changes: compare-and-swap on from.
func (t *Tx) moveJob(id int64, from, to JobState, set string, args ...any) error {
	q := `UPDATE jobs SET state = ?, updated_at = ?`
	if set != "" {
		q += ", " + set
	}
	q += ` WHERE id = ? AND state = ?`
	all := append([]any{to, t.now.UnixMilli()}, args...)
	all = append(all, id, from)
	res, err := t.exec(q, all...)
	if err != nil {
		if strings.Contains(err.Error(), "illegal job transition") || strings.Contains(err.Error(), "a finished job does not change") {
			return fmt.Errorf("%w: job %d from %s to %s", ErrJobState, id, from, to)
		}
		return fmt.Errorf("job %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var cur JobState
		if err := t.queryRow(`SELECT state FROM jobs WHERE id = ?`, id).Scan(&cur); err != nil {
			return fmt.Errorf("%w: %d", ErrNoJob, id)
		}
		return fmt.Errorf("%w: job %d is %s, not %s", ErrJobState, id, cur, from)
	}
	return nil
}

// StartJob moves a pending job to running, counts the run and clears its
// deadline and the host of an earlier attempt (PlaceJob records this one's). It returns the run number (1 for the first run).
func (t *Tx) StartJob(id int64) (int64, error) {
	if err := t.moveJob(id, JobPending, JobRunning, "runs = runs + 1, started_at = ?, next_due = NULL, host = ''", t.now.UnixMilli()); err != nil {
		return 0, err
	}
	var runs int64
	err := t.queryRow(`SELECT runs FROM jobs WHERE id = ?`, id).Scan(&runs)
	return runs, err
}

// JobEnd is how one run of a job ended.
type JobEnd struct {
	ID     int64
	To     JobState        // a final state, or pending to re-arm
	Result json.RawMessage // nil: none
	Error  string
	// Output of a command: its artifact (a<sha256>, the history ref) with
	// the bytes it holds, bounded preview and total size.
	Artifact     string
	ArtifactSize int64
	Preview      string
	OutputBytes  int64
	// Files are further artifacts of the run (a command's outputs=),
	// recorded with it so that history read serves them.
	Files   []JobFile
	NextDue time.Time // with To = pending: the next deadline
	// Notice, when set, is admitted to the owning session as a job input in
	// the same transaction, deduplicated by job and run.
	Notice string
}

// JobFile is one file a run brought back as an artifact.
type JobFile struct {
	Path     string `json:"path"`
	Artifact string `json:"artifact"` // a<sha256>
	Size     int64  `json:"bytes"`
}

// EndJob records the end of a running job's current run and, in the same
// transaction, the owner's notification and a job.<state> event for observers.
func (t *Tx) EndJob(e JobEnd) error {
	return t.endJob(e, JobRunning)
}

// CancelPendingJob cancels a job that is not running (a scheduled one).
func (t *Tx) CancelPendingJob(id int64, notice string) error {
	return t.endJob(JobEnd{ID: id, To: JobCancelled, Error: "cancelled", Notice: notice}, JobPending)
}

func (t *Tx) endJob(e JobEnd, from JobState) error {
	var session, kind string
	var runs int64
	if err := t.queryRow(`SELECT session_id, kind, runs FROM jobs WHERE id = ?`, e.ID).Scan(&session, &kind, &runs); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: %d", ErrNoJob, e.ID)
		}
		return fmt.Errorf("end job: %w", err)
	}
	var result any
	if e.Result != nil {
		result = string(e.Result)
	}
	var finished, due any
	if e.To.Final() {
		finished = t.now.UnixMilli()
	} else if e.To == JobPending {
		due = e.NextDue.UnixMilli()
	} else {
		return fmt.Errorf("%w: a run cannot end in %s", ErrJobState, e.To)
	}
	set := `result = COALESCE(?, result), error = ?, finished_at = ?, next_due = ?`
	args := []any{result, e.Error, finished, due}
	if e.Artifact != "" || e.Preview != "" || e.OutputBytes != 0 {
		set += `, output_artifact = ?, output_preview = ?, output_bytes = ?`
		args = append(args, e.Artifact, e.Preview, e.OutputBytes)
	}
	if err := t.moveJob(e.ID, from, e.To, set, args...); err != nil {
		return err
	}
	state := e.To
	if state == JobPending {
		state = JobSucceeded // a recurring run that ended well; a failed one says so in error
		if e.Error != "" {
			state = JobFailed
		}
	}
	ev, _ := json.Marshal(map[string]any{"job": e.ID, "kind": kind, "run": runs, "state": state, "error": e.Error, "result": e.Result})
	res, err := t.exec(`INSERT INTO events (session_id, kind, content, occurred_at, received_at) VALUES (?, ?, ?, ?, ?)`,
		session, "job."+string(state), string(ev), t.now.UnixMilli(), t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("end job: event: %w", err)
	}
	if p, perr := ParseRef(e.Artifact); perr == nil && p.Artifact != "" {
		// The output is history's like a cell's: history read takes the ref
		// jobs show prints, and retention and gc know the file is kept.
		eventID, _ := res.LastInsertId()
		if err := t.recordArtifact(p.Artifact, e.ArtifactSize, "text/plain; charset=utf-8", eventID); err != nil {
			return fmt.Errorf("end job: %w", err)
		}
	}
	for _, f := range e.Files {
		if p, perr := ParseRef(f.Artifact); perr == nil && p.Artifact != "" {
			eventID, _ := res.LastInsertId()
			if err := t.recordArtifact(p.Artifact, f.Size, "application/octet-stream", eventID); err != nil {
				return fmt.Errorf("end job: %w", err)
			}
		}
	}
	if e.Notice == "" {
		return nil
	}
	_, err = t.AdmitInput(NewInput{
		Session: session, SourceKind: "job", SourceKey: fmt.Sprintf("job:%d:%d:%s", e.ID, runs, from),
		Conversation: fmt.Sprintf("job:%d", e.ID), Author: "klbr", Directed: true,
		OccurredAt: t.now, ReceivedAt: t.now, Body: e.Notice,
	})
	return err
}

// RecoverJob moves a job found running at start to where its policy puts it:
// pending (due now) to run again, or unknown with a notice.
func (t *Tx) RecoverJob(id int64, to JobState, reason, notice string) error {
	if to == JobPending {
		return t.moveJob(id, JobRunning, JobPending, "error = ?, next_due = ?", reason, t.now.UnixMilli())
	}
	return t.endJob(JobEnd{ID: id, To: to, Error: reason, Notice: notice}, JobRunning)
}

// DeferJob puts a running job back to pending, due at due, with the reason
// it did not start (its host is unreachable or full): no run ended, so no
// event and no notice.
func (t *Tx) DeferJob(id int64, reason string, due time.Time) error {
	return t.moveJob(id, JobRunning, JobPending, "error = ?, next_due = ?", reason, due.UnixMilli())
}

// PlaceJob records the worker host a running job's attempt is dispatched
// to, before its unit is started there.
func (t *Tx) PlaceJob(id int64, host string) error {
	res, err := t.exec(`UPDATE jobs SET host = ?, updated_at = ? WHERE id = ? AND state = 'running'`, host, t.now.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("place job: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: job %d is not running", ErrJobState, id)
	}
	return nil
}

// NoteJob sets what a running job waits for (its error while it runs, such
// as a worker host that does not answer); "" clears it.
func (t *Tx) NoteJob(id int64, note string) error {
	res, err := t.exec(`UPDATE jobs SET error = ?, updated_at = ? WHERE id = ? AND state = 'running'`, note, t.now.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("note job: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: job %d is not running", ErrJobState, id)
	}
	return nil
}

// CheckpointJob stores a running job's checkpoint.
func (t *Tx) CheckpointJob(id int64, state json.RawMessage) error {
	res, err := t.exec(`UPDATE jobs SET checkpoint = ?, updated_at = ? WHERE id = ? AND state = 'running'`, string(state), t.now.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: job %d is not running", ErrJobState, id)
	}
	return nil
}

// SourceEvent is one outside event a source admits.
type SourceEvent struct {
	Key        string // stable: the same event has the same key
	Text       string
	Author     string
	OccurredAt time.Time
}

// ErrSourceBacklog refuses a source's events while too many of its earlier
// ones still wait for the agent.
var ErrSourceBacklog = errors.New("source backlog is full")

// EmitSource admits a running source job's events to its owning session
// with source authority, deduplicated by key, and stores its cursor, all in
// one transaction. It returns how many were new. While maxPending (> 0) of
// the source's events are pending it refuses with ErrSourceBacklog.
func (t *Tx) EmitSource(id int64, events []SourceEvent, cursor json.RawMessage, maxPending int) (admitted int, err error) {
	var session string
	var state JobState
	if err := t.queryRow(`SELECT session_id, state FROM jobs WHERE id = ? AND kind = 'source'`, id).Scan(&session, &state); err != nil {
		return 0, fmt.Errorf("%w: source %d", ErrNoJob, id)
	}
	if state != JobRunning {
		return 0, fmt.Errorf("%w: source %d is %s, not running", ErrJobState, id, state)
	}
	conv := fmt.Sprintf("source:%d", id)
	if maxPending > 0 {
		var pending int
		if err := t.queryRow(`SELECT count(*) FROM (SELECT 1 FROM inbox b JOIN inputs i ON i.id = b.input_id
			WHERE b.session_id = ? AND b.state = 'pending' AND i.conversation = ? LIMIT ?)`, session, conv, maxPending).Scan(&pending); err != nil {
			return 0, fmt.Errorf("emit: backlog: %w", err)
		}
		if pending+len(events) > maxPending {
			return 0, fmt.Errorf("%w: %d events of source %d wait for the agent (at most %d)", ErrSourceBacklog, pending, id, maxPending)
		}
	}
	for _, ev := range events {
		a, err := t.AdmitInput(NewInput{
			Session: session, SourceKind: "source", SourceKey: fmt.Sprintf("src:%d:%s", id, ev.Key),
			Conversation: conv, Author: ev.Author,
			OccurredAt: ev.OccurredAt, ReceivedAt: t.now, Body: ev.Text,
		})
		if err != nil {
			return 0, err
		}
		if !a.Duplicate {
			admitted++
		}
	}
	if cursor != nil {
		if _, err := t.exec(`UPDATE jobs SET cursor = ?, updated_at = ? WHERE id = ?`, string(cursor), t.now.UnixMilli(), id); err != nil {
			return 0, fmt.Errorf("emit: cursor: %w", err)
		}
	}
	return admitted, nil
}

const jobColumns = `id, kind, session_id, COALESCE(parent_id, 0), release, workspace, spec, budget, recovery, state, priority,
	schedule, tz, next_due, runs, result, error, output_artifact, output_preview, output_bytes, checkpoint, cursor,
	created_at, started_at, finished_at, updated_at, host`

// scanJobs reads and closes rows of jobColumns (never nil: an empty
// list); what names the query in an error.
func scanJobs(rows *sql.Rows, what string) ([]Job, error) {
	defer rows.Close()
	out := []Job{}
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

func scanJob(r rowScanner) (Job, error) {
	var j Job
	var spec, budget string
	var sched, result, checkpoint, cursor sql.NullString
	var due, started, finished sql.NullInt64
	var created, updated int64
	if err := r.Scan(&j.ID, &j.Kind, &j.Session, &j.Parent, &j.Release, &j.Workspace, &spec, &budget, &j.Recovery, &j.State,
		&j.Priority, &sched, &j.TZ, &due, &j.Runs, &result, &j.Error, &j.OutputArtifact, &j.OutputPreview, &j.OutputBytes,
		&checkpoint, &cursor, &created, &started, &finished, &updated, &j.Host); err != nil {
		return j, err
	}
	j.Spec, j.Budget = json.RawMessage(spec), json.RawMessage(budget)
	raw := func(s sql.NullString) json.RawMessage {
		if !s.Valid {
			return nil
		}
		return json.RawMessage(s.String)
	}
	at := func(n sql.NullInt64) *time.Time {
		if !n.Valid {
			return nil
		}
		t := time.UnixMilli(n.Int64)
		return &t
	}
	j.Schedule, j.Result, j.Checkpoint, j.Cursor = raw(sched), raw(result), raw(checkpoint), raw(cursor)
	j.NextDue, j.StartedAt, j.FinishedAt = at(due), at(started), at(finished)
	j.CreatedAt, j.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return j, nil
}

// Job reads one job.
func (s *Store) Job(ctx context.Context, id int64) (Job, error) {
	j, err := scanJob(s.rdb.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fmt.Errorf("%w: %d", ErrNoJob, id)
	}
	return j, err
}

// Job reads one job inside the transaction.
func (t *Tx) Job(id int64) (Job, error) {
	j, err := scanJob(t.queryRow(`SELECT `+jobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fmt.Errorf("%w: %d", ErrNoJob, id)
	}
	return j, err
}

// JobFilter narrows Jobs. Zero fields match everything.
type JobFilter struct {
	Session string
	State   JobState
	Kind    string
	Limit   int // 0 means 100; at most 1000
}

// Jobs lists jobs, newest first.
func (s *Store) Jobs(ctx context.Context, f JobFilter) ([]Job, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	f.Limit = min(f.Limit, 1000)
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs
		WHERE (? = '' OR session_id = ?) AND (? = '' OR state = ?) AND (? = '' OR kind = ?) ORDER BY id DESC LIMIT ?`,
		f.Session, f.Session, f.State, f.State, f.Kind, f.Kind, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	return scanJobs(rows, "jobs")
}

// RunningJobs lists every running job, oldest first (recovery at start).
func (s *Store) RunningJobs(ctx context.Context) ([]Job, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE state = 'running' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("running jobs: %w", err)
	}
	return scanJobs(rows, "running jobs")
}

// DueJobs returns up to limit pending jobs whose deadline is at or before
// now, earliest first (then by priority, highest first). Only a pending job
// has a deadline (a CHECK of the table).
func (s *Store) DueJobs(ctx context.Context, now time.Time, limit int) ([]Job, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs
		WHERE next_due IS NOT NULL AND next_due <= ? ORDER BY next_due, priority DESC, id LIMIT ?`,
		now.UnixMilli(), limit)
	if err != nil {
		return nil, fmt.Errorf("due jobs: %w", err)
	}
	return scanJobs(rows, "due jobs")
}

// NextDue is the earliest deadline of a pending job; ok is false when none.
func (s *Store) NextDue(ctx context.Context) (at time.Time, ok bool, err error) {
	// Only pending jobs have a deadline (a CHECK of the table): jobs_due alone answers.
	var due int64
	err = s.rdb.QueryRowContext(ctx, `SELECT next_due FROM jobs WHERE next_due IS NOT NULL ORDER BY next_due LIMIT 1`).Scan(&due)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next due: %w", err)
	}
	return time.UnixMilli(due), true, nil
}

// JobCount is how many jobs of a kind are in a state.
type JobCount struct {
	Kind  string   `json:"kind"`
	State JobState `json:"state"`
	Count int64    `json:"count"`
}

// JobCounts counts jobs by kind and state.
func (s *Store) JobCounts(ctx context.Context) ([]JobCount, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT kind, state, count(*) FROM jobs GROUP BY kind, state ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("job counts: %w", err)
	}
	defer rows.Close()
	var out []JobCount
	for rows.Next() {
		var c JobCount
		if err := rows.Scan(&c.Kind, &c.State, &c.Count); err != nil {
			return nil, fmt.Errorf("job counts: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
