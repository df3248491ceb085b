package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// CommandSpec is what a command job runs.
type CommandSpec struct {
	Argv    []string          `json:"argv"`
	Cwd     string            `json:"cwd,omitempty"` // bound to the workspace already
	Env     map[string]string `json:"env,omitempty"`
	Timeout float64           `json:"timeout"` // seconds
	// Host, when set, is where the command runs: a [hosts.NAME] or
	// "label:L" (package hosts); unset, it runs here.
	Host string `json:"host,omitempty"`
	// Inputs are workspace paths copied into the job's own directory
	// before it starts; Outputs are globs matched in that directory when it
	// ends, the files brought back as artifacts (files.go).
	Inputs  []string `json:"inputs,omitempty"`
	Outputs []string `json:"outputs,omitempty"`
}

// DefaultCommandTimeout is a command's timeout when none is given.
const DefaultCommandTimeout = time.Hour

// RunRequest is a tracked command to start.
type RunRequest struct {
	Session  string
	Parent   int64
	Release  string
	Spec     CommandSpec
	Recovery string // "" means manual
}

// Run admits a tracked command. It starts as soon as a slot is free, in its
// own placement scope, and outlives the cell and the kernel that asked.
func (m *Manager) Run(ctx context.Context, req RunRequest) (store.Job, error) {
	s := req.Spec
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return store.Job{}, fmt.Errorf("jobs.run: argv must name a program")
	}
	if len(s.Argv) > MaxArgv {
		return store.Job{}, fmt.Errorf("jobs.run: at most %d arguments", MaxArgv)
	}
	if s.Timeout < 0 || time.Duration(s.Timeout*float64(time.Second)) > m.cfg.MaxWall {
		return store.Job{}, fmt.Errorf("jobs.run: timeout must be between 0 and %s", m.cfg.MaxWall)
	}
	if s.Timeout == 0 {
		s.Timeout = min(DefaultCommandTimeout, m.cfg.MaxWall).Seconds()
	}
	if req.Recovery == "" {
		req.Recovery = Manual
	}
	if req.Recovery != Manual && req.Recovery != RetrySafe {
		return store.Job{}, fmt.Errorf("jobs.run: recovery is manual or retry_safe, not %q", req.Recovery)
	}
	spec := mustJSON(s)
	if len(spec) > MaxArgBytes {
		return store.Job{}, fmt.Errorf("jobs.run: argv and env are larger than %d bytes", MaxArgBytes)
	}
	if err := checkInputs(s.Inputs); err != nil {
		return store.Job{}, fmt.Errorf("jobs.run: %w", err)
	}
	if err := checkGlobs(s.Outputs); err != nil {
		return store.Job{}, fmt.Errorf("jobs.run: %w", err)
	}
	if (len(s.Inputs) > 0 || len(s.Outputs) > 0) && s.Cwd != "" {
		return store.Job{}, fmt.Errorf("jobs.run: cwd= and inputs=/outputs= exclude each other: with inputs or outputs the job runs in a directory of its own")
	}
	if s.Host != "" {
		if m.cfg.Hosts == nil {
			return store.Job{}, fmt.Errorf("jobs.run: host=%q, but klbr.toml defines no [hosts.NAME]", s.Host)
		}
		if err := m.cfg.Hosts.Check(s.Host); err != nil {
			return store.Job{}, fmt.Errorf("jobs.run: %w", err)
		}
		if s.Cwd != "" {
			return store.Job{}, fmt.Errorf("jobs.run: cwd= is for jobs that run here; a job on a host runs in a directory of its own there")
		}
	}
	dir, _, err := m.place(ctx, req.Session)
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs.run: %w", err)
	}
	return m.submit(ctx, store.NewJob{Kind: KindCommand, Session: req.Session, Parent: req.Parent, Release: req.Release,
		Workspace: dir, Spec: spec, Recovery: req.Recovery,
		Budget: mustJSON(map[string]any{"timeout": s.Timeout, "output_bytes": m.cfg.MaxOutput, "memory_max": m.cfg.Limits.MemoryMaxBytes, "tasks_max": m.cfg.Limits.TasksMax})})
}

// spooler keeps a command's output: up to max bytes in an artifact spool,
// and the last tail bytes for the preview. It never blocks or fails the command.
type spooler struct {
	mu      sync.Mutex
	sp      *artifacts.Spool // nil: no artifact store
	max     int64
	total   int64
	tail    []byte
	tailMax int
	err     error
}

func (s *spooler) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total += int64(len(p))
	if s.sp != nil && s.err == nil {
		if room := s.max - s.sp.Size(); room > 0 {
			_, s.err = s.sp.Write(p[:min(int64(len(p)), room)])
		}
	}
	s.tail = append(s.tail, p...)
	if len(s.tail) > s.tailMax {
		s.tail = append(s.tail[:0], s.tail[len(s.tail)-s.tailMax:]...)
	}
	return len(p), nil
}

func (s *spooler) preview() string {
	b := s.tail
	for len(b) > 0 && !utf8.Valid(b) { // a cut inside a rune
		b = b[1:]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func (m *Manager) runCommand(ctx context.Context, r *run) *store.JobEnd {
	j := r.job
	var s CommandSpec
	if err := json.Unmarshal(j.Spec, &s); err != nil {
		return &store.JobEnd{ID: j.ID, To: store.JobFailed, Error: "unreadable spec: " + err.Error()}
	}
	if s.Host != "" {
		return m.runRemote(ctx, r, s)
	}
	out := &spooler{max: m.cfg.MaxOutput, tailMax: m.cfg.PreviewBytes}
	if m.cfg.Artifacts != nil {
		var err error
		if out.sp, err = m.cfg.Artifacts.NewSpool(); err != nil {
			m.cfg.Log.Warn("jobs: no output artifact", "job", j.ID, "error", err)
		}
	}
	root, sb, err := m.place(ctx, j.Session)
	if err != nil {
		return &store.JobEnd{ID: j.ID, To: store.JobFailed, Error: err.Error()}
	}
	dir := s.Cwd
	if dir == "" {
		dir = root
	}
	own := len(s.Inputs) > 0 || len(s.Outputs) > 0
	if own {
		// Its own directory, as on a host: inputs copied in, outputs
		// brought back from it; removed when the run ends.
		var skipped []string
		dir, sb, skipped, err = m.localDir(j, s, root, sb)
		if dir != "" {
			defer os.RemoveAll(dir)
		}
		if err != nil {
			if out.sp != nil {
				out.sp.Discard()
			}
			e := &store.JobEnd{ID: j.ID, To: store.JobFailed, Error: err.Error()}
			e.Notice = commandNotice(j, e, 0)
			return e
		}
		r.inputsSkipped = skipped
	}
	started := time.Now()
	res, err := worker.RunCommand(ctx, worker.CommandSpec{
		Kernel: m.cfg.Kernel, Placer: m.cfg.Placer, Limits: m.cfg.Limits, Sandbox: sb,
		Session: j.Session, Seq: 1_000_000 + j.ID, Argv: s.Argv, Dir: dir, Env: s.Env,
		Timeout: time.Duration(s.Timeout * float64(time.Second)), Output: out,
	})
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
	if res.Cancelled && !r.cancelled.Load() && ctx.Err() == context.Canceled {
		return nil // klbr-core is stopping: the next start reconciles it
	}
	result := map[string]any{"exit_code": res.ExitCode, "timed_out": res.TimedOut, "output_bytes": out.total,
		"output_truncated": out.total > m.cfg.MaxOutput, "seconds": took.Seconds()}
	if e.Artifact != "" {
		result["output"] = e.Artifact
	}
	if len(s.Outputs) > 0 {
		files, skipped, oerr := m.localOutputs(dir, s.Outputs)
		if oerr != nil {
			m.cfg.Log.Warn("jobs: outputs of a job", "job", j.ID, "error", oerr)
			skipped = append(skipped, "not brought back: "+oerr.Error())
		}
		addFiles(result, e, files, skipped, r.inputsSkipped)
	} else if own {
		addFiles(result, e, nil, nil, r.inputsSkipped)
	}
	e.Result = mustJSON(result)
	switch {
	case err != nil:
		e.To, e.Error = store.JobFailed, err.Error()
	case r.cancelled.Load():
		e.To, e.Error = store.JobCancelled, "cancelled; its process tree was killed"
	case res.Cancelled || ctx.Err() == context.DeadlineExceeded:
		e.To, e.Error = store.JobFailed, fmt.Sprintf("ran past the wall-time limit (%s) and was killed", m.cfg.MaxWall)
	case res.TimedOut:
		e.To, e.Error = store.JobFailed, fmt.Sprintf("timed out after %gs and was killed", s.Timeout)
	case res.ExitCode != 0:
		e.To, e.Error = store.JobFailed, fmt.Sprintf("exit status %d", res.ExitCode)
	default:
		e.To = store.JobSucceeded
	}
	e.Notice = commandNotice(j, e, took)
	return e
}

func commandNotice(j store.Job, e *store.JobEnd, took time.Duration) string {
	var b strings.Builder
	what := string(e.To)
	if e.Error != "" {
		what += ": " + e.Error
	}
	fmt.Fprintf(&b, "[klbr] job %d %s (%s, %s).", j.ID, what, describe(j), took)
	if e.OutputBytes > 0 {
		fmt.Fprintf(&b, " Output: %d bytes", e.OutputBytes)
		if e.Artifact != "" {
			fmt.Fprintf(&b, " in %s", e.Artifact)
		}
		b.WriteString("; the result is in `await jobs.get(" + fmt.Sprint(j.ID) + ")`. Last output:\n")
		tail := e.Preview
		if len(tail) > 500 {
			tail = tail[len(tail)-500:]
			for len(tail) > 0 && !utf8.ValidString(tail[:1]) {
				tail = tail[1:]
			}
		}
		b.WriteString("  " + strings.ReplaceAll(strings.TrimRight(tail, "\n"), "\n", "\n  "))
	} else {
		b.WriteString(" No output; the result is in `await jobs.get(" + fmt.Sprint(j.ID) + ")`.")
	}
	if len(e.Files) > 0 {
		fmt.Fprintf(&b, "\nOutputs: %d files as artifacts (the result's \"artifacts\": path, artifact, bytes):", len(e.Files))
		for i, f := range e.Files {
			if i == 10 {
				fmt.Fprintf(&b, "\n  and %d more", len(e.Files)-10)
				break
			}
			fmt.Fprintf(&b, "\n  %s %s (%d bytes)", f.Path, f.Artifact, f.Size)
		}
	}
	return b.String()
}

// describe names a job for notices and listings.
func describe(j store.Job) string {
	switch j.Kind {
	case KindCommand:
		var s CommandSpec
		_ = json.Unmarshal(j.Spec, &s)
		line := strings.Join(s.Argv, " ")
		if len(line) > 80 {
			line = line[:77] + "..."
		}
		if s.Host != "" {
			line += " on " + s.Host
		}
		return "command: " + strings.ToValidUTF8(line, "?")
	default:
		var s RoutineSpec
		_ = json.Unmarshal(j.Spec, &s)
		if s.Host != "" {
			return j.Kind + " " + s.Entry + " on " + s.Host
		}
		return j.Kind + " " + s.Entry
	}
}
