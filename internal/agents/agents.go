// Package agents runs child agents: a session spawns a child with a task
// and the refs it grants; the child is a session of its own (parent_id set,
// its own history and workbench generation, pinned to the parent's behavior
// release at spawn) driven by the same turn loop as the root, and a job of
// kind child owned by the parent, which carries its state and result. The
// child's end commits its result and wakes the parent once (the jobs
// completion path). A child does not speak on the root's channels unless
// the spawn delegated them (Guard). A spawn may name a profile of the
// release (profiles/<name>.toml): its instructions, model route, budget
// and delegated ops (profile.go).
package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/budget"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/profiles"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// Bounds of what a cell may ask for.
const (
	MaxTaskBytes   = 64 << 10
	MaxRefs        = 100
	MaxRefLen      = 200
	MaxResultBytes = jobs.MaxInputBytes
	MaxArgs        = 256 << 10
	// MaxWaitSeconds bounds one agents.wait request; child.result() asks again.
	MaxWaitSeconds = jobs.MaxWaitSeconds
	// noticePreview bounds the result quoted in the parent's notification.
	noticePreview = 2000
)

// Delegable lists the speech ops a spawn may delegate to a child.
var Delegable = profiles.Delegable

// Config is what the agents run with.
type Config struct {
	Store  *store.Store
	Jobs   *jobs.Manager // its Wait serves child.result(); Ended is told of each end
	Limits store.ChildLimits
	// Start starts a spawned child's turn loop.
	Start func(session string)
	// StopKernel, if set, stops a session's workbench generation (its
	// Python kernel) without waiting: a cancelled or exhausted child's.
	StopKernel func(session, reason string)
	// MaxChildWall caps every child's wall time since its spawn
	// (agents.max_child_wall_seconds; 0: only its budget's wall_seconds).
	MaxChildWall time.Duration
	Clock        func() time.Time
	// Workspaces makes a child's own workspace (workspace="worktree") and
	// says where each session works; nil: every child shares the workspace.
	Workspaces *workspace.Workspaces
	// Tree is where a behavior release's files are (its profiles/); nil:
	// no profiles.
	Tree func(release string) string
	// Routes checks that model routes are configured in the running
	// klbr.toml (a profile's route and fallback); nil: none are.
	Routes func(names ...string) error
	// GrantRef, if set, checks a ref a spawn grants (the spawner must see
	// it itself) and returns it canonical (history.Reader.GrantRef).
	GrantRef func(ctx context.Context, session, ref string) (string, error)
	// Plan, if set, is job.plan, asked before a spawn as before a job: a
	// refusal refuses the spawn with its reason; its priority is recorded
	// on the child's job. It falls back as for jobs (admitted, priority 0).
	Plan func(ctx context.Context, session string, in jobs.PlanInput) jobs.Plan
	// Log, if set, takes what fails where no caller hears of it.
	Log *slog.Logger
}

// Agents answers the agents.* host requests and ends children.
type Agents struct {
	cfg Config

	kick chan struct{} // a spawn: the wall time sweep looks again
	res  reservations  // budget.usd's requests in flight (Reserve)
	stop chan struct{}
	done chan struct{}
}

// New returns the child agents' service; it installs itself as the way the
// jobs manager cancels a child.
func New(cfg Config) *Agents {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	a := &Agents{cfg: cfg, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		res: reservations{by: map[string]float64{}, changed: make(chan struct{})}}
	if cfg.Jobs != nil {
		cfg.Jobs.SetChildCancel(a.Cancel)
	}
	return a
}

// HandleRequest implements worker.Handler for agents.*.
func (a *Agents) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	session := workbench.SessionFrom(ctx)
	if session == "" {
		return nil, &worker.RequestError{Code: "unsupported", Message: r.Op + " needs a session"}
	}
	if len(r.Args) > MaxArgs {
		return nil, invalid("%s: arguments larger than %d bytes", r.Op, MaxArgs)
	}
	switch r.Op {
	case "agents.spawn":
		release := ""
		if p, ok := workbench.PinFrom(ctx); ok {
			release = p.Release
		}
		return a.spawn(ctx, session, release, r)
	case "agents.remove_workspace":
		var args struct {
			ID int64 `json:"id"`
		}
		if err := decode(r, &args); err != nil {
			return nil, err
		}
		j, err := a.own(ctx, session, args.ID)
		if err != nil {
			return answer(j, err)
		}
		w, err := a.RemoveWorkspace(ctx, j)
		if err != nil {
			return answer(j, err)
		}
		return json.Marshal(map[string]any{"id": j.ID, "removed": w.Dir, "branch": w.Branch})
	case "agents.get", "agents.cancel", "agents.wait":
		var args struct {
			ID      int64   `json:"id"`
			Since   int64   `json:"since"`
			Timeout float64 `json:"timeout"`
		}
		if err := decode(r, &args); err != nil {
			return nil, err
		}
		j, err := a.own(ctx, session, args.ID)
		if err != nil {
			return answer(j, err)
		}
		switch r.Op {
		case "agents.cancel":
			j, err = a.Cancel(ctx, j)
		case "agents.wait":
			if math.IsNaN(args.Timeout) || args.Timeout <= 0 || args.Timeout > MaxWaitSeconds {
				args.Timeout = MaxWaitSeconds
			}
			j, err = a.cfg.Jobs.Wait(ctx, j.ID, args.Since, time.Duration(args.Timeout*float64(time.Second)))
		}
		return answer(j, err)
	case "agents.list":
		var args struct {
			State string `json:"state"`
			Limit int    `json:"limit"`
		}
		if err := decode(r, &args); err != nil {
			return nil, err
		}
		js, err := a.cfg.Store.Jobs(ctx, store.JobFilter{Session: session, Kind: jobs.KindChild, State: store.JobState(args.State), Limit: args.Limit})
		if err != nil {
			return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
		}
		return json.Marshal(map[string]any{"children": js})
	case "agents.profiles":
		release := ""
		if p, ok := workbench.PinFrom(ctx); ok {
			release = p.Release
		}
		return a.listProfiles(ctx, session, release)
	case "agents.current":
		j, err := a.cfg.Store.ChildJobOf(ctx, session)
		if errors.Is(err, store.ErrNoJob) {
			return json.RawMessage("null"), nil
		}
		return answer(j, err)
	case "agents.finish":
		var args struct {
			Result json.RawMessage `json:"result"`
		}
		if err := decode(r, &args); err != nil {
			return nil, err
		}
		if len(args.Result) == 0 {
			args.Result = json.RawMessage("null")
		}
		if len(args.Result) > MaxResultBytes {
			return nil, invalid("agents.finish: the result is larger than %d bytes; put it in a file or the history and return a reference", MaxResultBytes)
		}
		j, err := a.end(ctx, session, store.JobSucceeded, args.Result, "", "finished")
		if errors.Is(err, store.ErrNoJob) {
			return nil, &worker.RequestError{Code: "unsupported", Message: "agents.finish: this session is no child agent"}
		}
		return answer(j, err)
	}
	return nil, &worker.RequestError{Code: "unsupported", Message: fmt.Sprintf("%s is not served here", r.Op)}
}

// spawnArgs are agents.spawn's arguments.
type spawnArgs struct {
	Task      string          `json:"task"`
	Refs      []string        `json:"refs"`
	Budget    json.RawMessage `json:"budget"`
	Delegate  []string        `json:"delegate"`
	Profile   string          `json:"profile"`
	Workspace string          `json:"workspace"`
	// Host, when set, is where the child works: a [hosts.NAME] or
	// "label:L", in a copy of the spawner's workspace there.
	Host string `json:"host"`
}

// MaxHostLen bounds a spawn's host=.
const MaxHostLen = 200

// validWorkspace reports whether mode is a spawn's workspace ("" is shared).
func validWorkspace(mode string) bool {
	return slices.Contains([]string{"", store.WorkspaceShared, store.WorkspaceWorktree, store.WorkspaceReadOnly}, mode)
}

// parseSpawn decodes and checks agents.spawn's arguments (a cell's, bounded).
func parseSpawn(raw json.RawMessage) (spawnArgs, error) {
	var args spawnArgs
	if len(raw) > MaxArgs {
		return args, invalid("agents.spawn: arguments larger than %d bytes", MaxArgs)
	}
	if err := decode(worker.Request{Op: "agents.spawn", Args: raw}, &args); err != nil {
		return args, err
	}
	switch {
	case strings.TrimSpace(args.Task) == "":
		return args, invalid("agents.spawn: task is empty")
	case len(args.Task) > MaxTaskBytes || !utf8.ValidString(args.Task):
		return args, invalid("agents.spawn: task must be valid UTF-8 of at most %d bytes", MaxTaskBytes)
	case len(args.Refs) > MaxRefs:
		return args, invalid("agents.spawn: at most %d refs", MaxRefs)
	case len(args.Delegate) > len(Delegable):
		return args, invalid("agents.spawn: at most %d delegated ops", len(Delegable))
	case args.Profile != "" && !profiles.NamePattern.MatchString(args.Profile):
		return args, invalid("agents.spawn: %q is not a profile name (%s)", args.Profile, profiles.NamePattern)
	case !validWorkspace(args.Workspace):
		return args, invalid("agents.spawn: workspace is \"shared\" (the default), \"worktree\" or \"read_only\", not %q", args.Workspace)
	case len(args.Host) > MaxHostLen || !utf8.ValidString(args.Host):
		return args, invalid("agents.spawn: host= is a [hosts.NAME] or \"label:L\" of at most %d bytes", MaxHostLen)
	}
	for _, ref := range args.Refs {
		if ref == "" || len(ref) > MaxRefLen || !utf8.ValidString(ref) {
			return args, invalid("agents.spawn: a ref is a non-empty string of at most %d bytes", MaxRefLen)
		}
	}
	for _, d := range args.Delegate {
		if !slices.Contains(Delegable, d) {
			return args, invalid("agents.spawn: %q cannot be delegated; delegable: %s", d, strings.Join(Delegable, ", "))
		}
	}
	args.Delegate = slices.Compact(slices.Sorted(slices.Values(args.Delegate)))
	budget, err := budget.Parse(args.Budget)
	if err != nil {
		return args, invalid("agents.spawn: %v", err)
	}
	args.Budget = budget.JSON() // recorded normalized: only the keys set
	return args, nil
}

func (a *Agents) spawn(ctx context.Context, session, release string, r worker.Request) (json.RawMessage, error) {
	args, err := parseSpawn(r.Args)
	if err != nil {
		return nil, err
	}
	if release == "" {
		if s, err := a.cfg.Store.Session(ctx, session); err == nil {
			release = s.PolicyRevision
		}
	}
	if a.cfg.GrantRef != nil {
		for i, ref := range args.Refs {
			if args.Refs[i], err = a.cfg.GrantRef(ctx, session, ref); err != nil {
				return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf("agents.spawn: ref %q cannot be granted: %v", ref, err)}
			}
		}
	}
	c := store.NewChild{Parent: session, Release: release, Task: args.Task, Refs: args.Refs,
		Delegate: args.Delegate, Budget: args.Budget, Limits: a.cfg.Limits}
	asked := args.Delegate
	if args.Profile != "" {
		if args, err = a.applyProfile(args, release, &c); err != nil {
			return nil, err
		}
	}
	if err := a.narrow(ctx, session, &args, &c, asked); err != nil {
		return nil, err
	}
	if err := checkHostWorkspace(args); err != nil {
		return nil, err
	}
	var planHost *string
	if c.Priority, planHost, err = a.plan(ctx, session, args); err != nil {
		return nil, err
	}
	if planHost != nil {
		// job.plan sends the child to a host: checked as a spawn's host=.
		args.Host = *planHost
		if err := checkHostWorkspace(args); err != nil {
			return nil, &worker.RequestError{Code: "refused", Message: fmt.Sprintf("agents.spawn: job.plan chose host %q: %v", *planHost, err)}
		}
	}
	place, made, err := a.place(ctx, session, args.Workspace, args.Host)
	if err != nil {
		return nil, err
	}
	c.Workspace = place
	c.BudgetNote = a.budgetNote(args.Budget)
	var sp store.Spawned
	err = a.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		sp, err = tx.SpawnChild(c)
		return err
	})
	if err != nil {
		if made {
			// Nothing of the spawn is stored: its worktree goes too.
			a.cfg.Workspaces.Remove(context.WithoutCancel(ctx), *place)
		}
		return answer(store.Job{}, err)
	}
	a.poke()
	// The child's traces link to the span of the request that spawned it:
	// remembered before the child starts, so its first attempt finds it.
	if t, ref := tracing.From(ctx), tracing.SpanFrom(ctx).Ref(); t != nil && ref != "" {
		t.Remember(sp.Session, ref)
	}
	if a.cfg.Start != nil {
		a.cfg.Start(sp.Session)
	}
	j, err := a.cfg.Store.Job(ctx, sp.Job)
	return answer(j, err)
}

// place is where a child of session spawned with mode works, made now
// for a worktree (made reports it, to be removed if the spawn fails).
// Shared is the parent's place as the parent has it.
func (a *Agents) place(ctx context.Context, session, mode, host string) (p *store.ChildWorkspace, made bool, err error) {
	ws := a.cfg.Workspaces
	if ws == nil {
		if mode == store.WorkspaceWorktree || mode == store.WorkspaceReadOnly || host != "" {
			return nil, false, &worker.RequestError{Code: "unsupported", Message: "agents.spawn: workspace " + mode + " needs the workspaces, which this daemon has not"}
		}
		return nil, false, nil
	}
	parent, err := ws.For(ctx, session)
	if err != nil {
		return nil, false, &worker.RequestError{Code: "failed", Message: "agents.spawn: " + err.Error()}
	}
	if host != "" {
		return a.placeOnHost(ctx, session, parent, host)
	}
	if parent.Host != "" && mode != "" && mode != store.WorkspaceShared {
		return nil, false, &worker.RequestError{Code: "refused", Message: fmt.Sprintf("agents.spawn: workspace %s: this session works in a copy on host %s; "+
			"its children share it there (workspace=\"shared\"), or get a copy of their own with host=", mode, parent.Host)}
	}
	var out store.ChildWorkspace
	switch mode {
	case store.WorkspaceWorktree:
		if out, err = ws.Make(ctx, parent, session); err != nil {
			return nil, false, &worker.RequestError{Code: "refused", Message: "agents.spawn: no worktree for the child: " + err.Error()}
		}
		made = true
	case store.WorkspaceReadOnly:
		out = ws.ReadOnly(parent)
	default:
		out = ws.Inherit(parent)
	}
	return &out, made, nil
}

// RemoveWorkspace removes the worktree or copy of child job j, which has
// ended, and returns it; a git repository's branch is brought into the
// workspace's first and stays there (the child's commits are the parent's
// to merge). Removing it again is no
// error. The spec keeps naming it: a finished job's record does not change.
func (a *Agents) RemoveWorkspace(ctx context.Context, j store.Job) (store.ChildWorkspace, error) {
	spec, err := store.ChildSpecOf(j)
	if err != nil {
		return store.ChildWorkspace{}, err
	}
	w := spec.Workspace
	switch {
	case a.cfg.Workspaces == nil || w == nil || w.Mode != store.WorkspaceWorktree:
		return store.ChildWorkspace{}, &worker.RequestError{Code: "invalid", Message: fmt.Sprintf("agents.remove_workspace: child %d has no worktree of its own", j.ID)}
	case j.State == store.JobRunning || j.State == store.JobPending:
		return *w, &worker.RequestError{Code: "state", Message: fmt.Sprintf("agents.remove_workspace: child %d is %s; cancel it or wait for its end first", j.ID, j.State)}
	}
	if err := a.cfg.Workspaces.Remove(ctx, *w); err != nil {
		return *w, &worker.RequestError{Code: "failed", Message: "agents.remove_workspace: " + err.Error()}
	}
	return *w, nil
}

// PlanSpec is the spec job.plan is given for a child (kind "child").
type PlanSpec struct {
	Task      string          `json:"task"`
	Refs      []string        `json:"refs"`
	Profile   string          `json:"profile"`
	Workspace string          `json:"workspace"`
	Budget    json.RawMessage `json:"budget"`
	Delegate  []string        `json:"delegate"`
	Depth     int             `json:"depth"` // the child's: a root's children are at 1
	Host      string          `json:"host"`  // as asked (host= or its profile's); "": here
}

// plan asks job.plan about a spawn; it returns the priority it gave and
// the host it chose (nil: none), or the refusal.
func (a *Agents) plan(ctx context.Context, session string, args spawnArgs) (int, *string, error) {
	if a.cfg.Plan == nil {
		return 0, nil, nil
	}
	depth, _, err := a.cfg.Store.Depth(ctx, session)
	if err != nil {
		return 0, nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	running, err := a.cfg.Store.Jobs(ctx, store.JobFilter{Session: session, Kind: jobs.KindChild, State: store.JobRunning, Limit: 1000})
	if err != nil {
		return 0, nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	spec, _ := json.Marshal(PlanSpec{Task: args.Task, Refs: nonNil(args.Refs), Profile: args.Profile, Workspace: args.Workspace,
		Budget: args.Budget, Delegate: nonNil(args.Delegate), Depth: depth + 1, Host: args.Host})
	p := a.cfg.Plan(ctx, session, jobs.PlanInput{Kind: jobs.KindChild, Spec: spec, Recovery: "resume", Running: len(running)})
	if !p.Admit {
		return 0, nil, &worker.RequestError{Code: "refused", Message: "agents.spawn: refused by job.plan: " + p.Reason}
	}
	return p.Priority, p.Host, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// own reads child job id if session owns it.
func (a *Agents) own(ctx context.Context, session string, id int64) (store.Job, error) {
	j, err := a.cfg.Store.Job(ctx, id)
	if err == nil && (j.Session != session || j.Kind != jobs.KindChild) {
		return store.Job{}, fmt.Errorf("%w: no child %d of %s", store.ErrNoJob, id, session)
	}
	return j, err
}

// Cancel cancels running child job j (asked by its parent or the
// operator): it ends cancelled, its parent is told once, as of any job's
// end, and its session is stopped, which cuts off its model request or
// cell at once.
func (a *Agents) Cancel(ctx context.Context, j store.Job) (store.Job, error) {
	spec, err := store.ChildSpecOf(j)
	if err != nil {
		return j, err
	}
	return a.endTree(ctx, spec.Session, store.JobCancelled, nil, "cancelled", "its session was stopped", true)
}

func (a *Agents) ended(id int64) {
	if a.cfg.Jobs != nil {
		a.cfg.Jobs.Ended(id)
	}
}

func stopSession(tx *store.Tx, id, reason string) error {
	s, err := tx.Session(id)
	if err != nil || s.State == store.StateStopped {
		return err
	}
	return tx.TransitionSession(id, s.State, store.StateStopped, reason)
}

// Idle is the turn loop's report of an attempt that ended idle: a child
// that ends its turn without agents.finish ends with its last text as the
// result, marked so.
func (a *Agents) Idle(ctx context.Context, session, text string) {
	if !strings.HasPrefix(session, "child-") {
		return
	}
	res, _ := json.Marshal(map[string]any{"text": text, "implicit": true,
		"note": "the child ended its turn without agents.finish: this is its last scratchpad text"})
	_, _ = a.end(ctx, session, store.JobSucceeded, res, "", "ended its turn without agents.finish")
}

// end ends session's child job with result and wakes its parent once; its
// running children are cancelled with it (endTree).
func (a *Agents) end(ctx context.Context, session string, to store.JobState, result json.RawMessage, errText, how string) (store.Job, error) {
	return a.endTree(ctx, session, to, result, errText, how, false)
}

// Notice is the parent's notification of child id's end.
func Notice(id int64, session string, to store.JobState, how string, result json.RawMessage, errText string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[klbr] child %d %s (session %s, %s).", id, to, session, how)
	if errText != "" {
		fmt.Fprintf(&b, " Error: %s.", errText)
	}
	if len(result) > 0 {
		r := string(result)
		if len(r) > noticePreview {
			cut := noticePreview
			for cut > 0 && !utf8.RuneStart(r[cut]) {
				cut--
			}
			r = r[:cut] + fmt.Sprintf(" … (%d bytes in all)", len(result))
		}
		fmt.Fprintf(&b, " Result: %s", r)
	}
	fmt.Fprintf(&b, "\nThe whole record is in `await agents.get(%d)`.", id)
	return b.String()
}

func answer(j store.Job, err error) (json.RawMessage, error) {
	var re *worker.RequestError
	switch {
	case err == nil:
		return json.Marshal(j)
	case errors.As(err, &re):
		return nil, err
	case errors.Is(err, store.ErrNoJob):
		return nil, &worker.RequestError{Code: "not_found", Message: err.Error()}
	case errors.Is(err, store.ErrChildBudget):
		return nil, &worker.RequestError{Code: "refused", Message: "agents.spawn: " + err.Error()}
	case errors.Is(err, store.ErrJobState):
		return nil, &worker.RequestError{Code: "state", Message: err.Error()}
	default:
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
}

func decode(r worker.Request, v any) error {
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
