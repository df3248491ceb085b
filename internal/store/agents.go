package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A child agent is a session whose parent_id names the session that
// spawned it, and a job of kind child owned by that parent: the job carries
// the child's state and result, and its end wakes the parent once (EndJob).
// The job's spec names the child's session: {"session", "task", "refs",
// "delegate", "workspace"}, and "profile", "route", "fallback" when it was
// spawned with a profile.

// ErrChildBudget refuses a spawn that would pass a limit of the tree.
var ErrChildBudget = errors.New("child budget exhausted")

// ChildLimits bound a session tree at spawn; zero fields do not bound.
type ChildLimits struct {
	MaxDepth       int   // a root's children are at depth 1
	MaxDescendants int   // sessions under the root, finished ones included
	MaxConcurrent  int   // running children of one parent
	MaxTreeTokens  int64 // model tokens of all the root's descendants, summed
	// MaxSpawnsPerTree bounds the children under one child of a root
	// (its subtree, finished ones included): agents.max_spawns_per_tree.
	MaxSpawnsPerTree int
	// MaxSpawnsPerDay bounds the child jobs created since Day's start:
	// agents.max_spawns_per_day.
	MaxSpawnsPerDay int
	// Day returns the current day's start and end (the caps' time zone).
	Day func() (start, end time.Time)
}

// NewChild is a child to spawn.
type NewChild struct {
	Parent   string // the spawning session
	Release  string // the behavior release it is pinned to ("" leaves it unpinned)
	Task     string
	Refs     []string
	Delegate []string        // the speech ops the parent lends it (local.send, discord.*)
	Budget   json.RawMessage // as asked, recorded on the job
	Limits   ChildLimits
	// Workspace is where the child works (nil: not recorded, the root's).
	Workspace *ChildWorkspace
	// The profile it was spawned with ("": none): its name, its model
	// route and fallback (recorded in the spec; "" the agent's plan) and
	// its instructions (added to the task input).
	Profile, Route string
	Fallback       []string
	Instructions   string
	Priority       int    // job.plan's, recorded on the job
	BudgetNote     string // what the child is told of its budget, ending its task input
}

// ChildSpec is a child job's spec.
type ChildSpec struct {
	Session  string   `json:"session"`
	Task     string   `json:"task"`
	Refs     []string `json:"refs"`
	Delegate []string `json:"delegate"`
	// Workspace is where the child works; absent in children spawned
	// before workspaces were recorded (they work in the root workspace).
	Workspace *ChildWorkspace `json:"workspace,omitempty"`
	// The profile it was spawned with, and the model route its requests
	// go along (then Fallback); unset: the agent's plan.
	Profile  string   `json:"profile,omitempty"`
	Route    string   `json:"route,omitempty"`
	Fallback []string `json:"fallback,omitempty"`
}

// Workspace modes of a child.
const (
	WorkspaceShared   = "shared"    // its parent's workspace, as its parent has it
	WorkspaceWorktree = "worktree"  // a git worktree (or a copy) of its own
	WorkspaceReadOnly = "read_only" // its parent's workspace, which it may not modify
)

// ChildWorkspace is where a child's cells, commands and jobs work.
type ChildWorkspace struct {
	Mode string `json:"mode"` // shared, worktree or read_only
	Dir  string `json:"dir"`  // its working directory
	// A worktree's: Kind "git" (a repository of its own the host made, on
	// Branch from commit Base; GitDir is set only for a git worktree sharing
	// the workspace's repository, as spawns made before that) or "copy" (of
	// a directory that is no repository); Root is the directory it was made
	// from.
	Kind   string `json:"kind,omitempty"`
	Branch string `json:"branch,omitempty"`
	Base   string `json:"base,omitempty"`
	GitDir string `json:"git_dir,omitempty"`
	Root   string `json:"root,omitempty"`
	// ReadOnly: the child may not modify Dir; Enforced says what the
	// operating system enforces of that, as measured at spawn.
	ReadOnly bool   `json:"read_only,omitempty"`
	Enforced string `json:"enforced,omitempty"`
	// Host, when set, is the worker host the child works on ([hosts.NAME]):
	// Dir is then a directory there, a copy of Root (Kind "copy") made from
	// the tree Base names (its SHA-256), whose changes come back as a patch.
	Host string `json:"host,omitempty"`
}

// ChildWorkspaceText is the part of a child's task input that says where
// it works and what is enforced.
func ChildWorkspaceText(w *ChildWorkspace) string {
	if w == nil {
		return ""
	}
	var b strings.Builder
	switch w.Mode {
	case WorkspaceWorktree:
		if w.Host != "" {
			fmt.Fprintf(&b, "\n\nYou work on host %s: your cells and the commands you run (jobs.run) run there. Your workspace is a copy of your parent's %s on that host, %s (no .git): edit there; when you end, your changes come back to your parent as a patch, which it applies or not. Nothing you do there changes your parent's workspace.", w.Host, w.Root, w.Dir)
			break
		}
		if w.Kind == "git" {
			fmt.Fprintf(&b, "\n\nYour workspace is a git repository of its own, %s, on branch %s (from %s): edit and commit there; when you end, your branch is brought into your parent's repository for it to merge. Other children do not see your edits, nor you theirs.", w.Dir, w.Branch, short(w.Base))
		} else {
			fmt.Fprintf(&b, "\n\nYour workspace is a copy of its own, %s, of %s (no git repository): your parent reads your changes there.", w.Dir, w.Root)
		}
	case WorkspaceReadOnly:
		fmt.Fprintf(&b, "\n\nYour workspace, %s, is your parent's, READ-ONLY to you: do not modify it.", w.Dir)
	default:
		fmt.Fprintf(&b, "\n\nYour workspace, %s, is shared with your parent (and its other shared children): your edits are theirs at once.", w.Dir)
		if w.ReadOnly {
			b.WriteString(" It is read-only to your parent, and so to you.")
		}
	}
	if w.Enforced != "" {
		fmt.Fprintf(&b, " Enforced: %s.", w.Enforced)
	}
	return b.String()
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Spawned is a child as spawned: its job and its session.
type Spawned struct {
	Job     int64  `json:"job"`
	Session string `json:"session"`
	Depth   int    `json:"depth"`
}

// ChildTaskConversation is the conversation of a child's task input.
const ChildTaskConversation = "parent"

// ChildSessionID is the session id of child job id.
func ChildSessionID(job int64) string { return fmt.Sprintf("child-%d", job) }

// SpawnChild creates, in this transaction, the child's job (kind child,
// running, owned by the parent), its session (parent_id set, pinned to
// c.Release) and the task as its first input, after checking c.Limits.
func (t *Tx) SpawnChild(c NewChild) (Spawned, error) {
	st, err := t.sessionState(c.Parent)
	if err != nil {
		return Spawned{}, err
	}
	if st == StateStopped {
		return Spawned{}, fmt.Errorf("%w: %s", ErrSessionStopped, c.Parent)
	}
	depth, root, err := t.ancestry(c.Parent)
	if err != nil {
		return Spawned{}, err
	}
	l := c.Limits
	if l.MaxDepth > 0 && depth+1 > l.MaxDepth {
		return Spawned{}, fmt.Errorf("%w: a child of %s would be at depth %d (agents.max_depth = %d)", ErrChildBudget, c.Parent, depth+1, l.MaxDepth)
	}
	if l.MaxDescendants > 0 {
		n, err := t.descendants(root)
		if err != nil {
			return Spawned{}, err
		}
		if n >= l.MaxDescendants {
			return Spawned{}, fmt.Errorf("%w: the tree of %s has %d descendant sessions (agents.max_descendants = %d)", ErrChildBudget, root, n, l.MaxDescendants)
		}
	}
	if l.MaxTreeTokens > 0 {
		u, err := t.treeUsage(root)
		if err != nil {
			return Spawned{}, fmt.Errorf("spawn: %w", err)
		}
		if u.Tokens >= l.MaxTreeTokens {
			return Spawned{}, fmt.Errorf("%w: the tree of %s has spent %d of %d tokens (agents.max_tree_tokens)", ErrChildBudget, root, u.Tokens, l.MaxTreeTokens)
		}
	}
	if err := t.spawnCaps(c.Parent, depth, l); err != nil {
		return Spawned{}, err
	}
	if l.MaxConcurrent > 0 {
		var n int
		if err := t.queryRow(`SELECT count(*) FROM jobs WHERE kind = 'child' AND session_id = ? AND state = 'running'`, c.Parent).Scan(&n); err != nil {
			return Spawned{}, fmt.Errorf("spawn: %w", err)
		}
		if n >= l.MaxConcurrent {
			return Spawned{}, fmt.Errorf("%w: %s has %d children running (agents.max_concurrent = %d)", ErrChildBudget, c.Parent, n, l.MaxConcurrent)
		}
	}
	if c.Refs == nil {
		c.Refs = []string{}
	}
	if c.Delegate == nil {
		c.Delegate = []string{}
	}
	id, err := t.InsertJob(NewJob{Kind: "child", Session: c.Parent, Release: c.Release, Spec: json.RawMessage("{}"),
		Budget: c.Budget, Recovery: "resume", Priority: c.Priority})
	if err != nil {
		return Spawned{}, err
	}
	child := ChildSessionID(id)
	spec, _ := json.Marshal(ChildSpec{Session: child, Task: c.Task, Refs: c.Refs, Delegate: c.Delegate, Workspace: c.Workspace,
		Profile: c.Profile, Route: c.Route, Fallback: c.Fallback})
	if _, err := t.exec(`UPDATE jobs SET spec = ? WHERE id = ?`, string(spec), id); err != nil {
		return Spawned{}, fmt.Errorf("spawn: %w", err)
	}
	if _, err := t.StartJob(id); err != nil {
		return Spawned{}, err
	}
	if c.Workspace != nil && c.Workspace.Host != "" {
		if err := t.PlaceJob(id, c.Workspace.Host); err != nil {
			return Spawned{}, err
		}
	}
	if err := t.CreateSession(child, c.Parent); err != nil {
		return Spawned{}, err
	}
	if c.Release != "" {
		if _, err := t.Activate(child, 0, c.Release, "initial", fmt.Sprintf("child %d of %s: pinned to its parent's release at spawn", id, c.Parent)); err != nil {
			return Spawned{}, err
		}
	}
	if _, err := t.AdmitInput(NewInput{Session: child, SourceKind: "job", SourceKey: fmt.Sprintf("child:%d:task", id),
		Conversation: ChildTaskConversation, Author: c.Parent, Directed: true, OccurredAt: t.now, ReceivedAt: t.now,
		Body: ChildTaskText(id, c.Parent, c.Task, c.Refs, c.Delegate) + ChildProfileText(c.Profile, c.Instructions) + ChildWorkspaceText(c.Workspace) + c.BudgetNote}); err != nil {
		return Spawned{}, err
	}
	return Spawned{Job: id, Session: child, Depth: depth + 1}, nil
}

// ChildTaskText is the first input of child job id.
func ChildTaskText(id int64, parent, task string, refs, delegate []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[klbr] You are child agent %d of session %s. Your task:\n%s\n", id, parent, task)
	if len(refs) > 0 {
		fmt.Fprintf(&b, "\nEvidence you were given (read it with `await history.read(ref)`): %s\n", strings.Join(refs, ", "))
		if slices.ContainsFunc(refs, func(r string) bool { return strings.HasPrefix(r, "scope:") }) {
			b.WriteString("A scope:<scope> ref opens that scope of your parent's history: `await history.search(...)` finds it; " +
				"a summary covering scopes you were not granted is refused, and `await history.children(ref)` lists what of it you may read.\n")
		}
	}
	b.WriteString("\nWhen you are done, end with `await agents.finish(result)` (any JSON value): your parent is woken with it. ")
	if len(delegate) == 0 {
		b.WriteString("You report to your parent only: local.send and discord.* are refused to you.")
	} else {
		fmt.Fprintf(&b, "Your parent delegated to you: %s; anything else speaks through your result.", strings.Join(delegate, ", "))
	}
	return b.String()
}

// ChildProfileText is what a child's task input adds for its profile:
// the profile's instructions ("" without a profile).
func ChildProfileText(profile, instructions string) string {
	if profile == "" {
		return ""
	}
	if strings.TrimSpace(instructions) == "" {
		return fmt.Sprintf("\n\nYou were spawned with profile %s.", profile)
	}
	return fmt.Sprintf("\n\nYou were spawned with profile %s. Its instructions:\n%s", profile, strings.TrimSpace(instructions))
}

// ancestry returns how deep session id is (a root: 0) and its root.
func (t *Tx) ancestry(id string) (depth int, root string, err error) {
	err = t.queryRow(ancestryQuery, id).Scan(&depth, &root)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	return depth, root, err
}

const ancestryQuery = `WITH RECURSIVE up(id, parent, depth) AS (
		SELECT id, parent_id, 0 FROM sessions WHERE id = ?
		UNION ALL SELECT s.id, s.parent_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent WHERE up.depth < 1000)
	SELECT depth, id FROM up ORDER BY depth DESC LIMIT 1`

// descendants counts the sessions under id, at any depth.
func (t *Tx) descendants(id string) (int, error) {
	var n int
	err := t.queryRow(descendantsQuery, id).Scan(&n)
	return n, err
}

const descendantsQuery = `WITH RECURSIVE down(id, depth) AS (
		SELECT id, 0 FROM sessions WHERE parent_id = ?
		UNION ALL SELECT s.id, down.depth + 1 FROM sessions s JOIN down ON s.parent_id = down.id WHERE down.depth < 1000)
	SELECT count(*) FROM down`

// childJobQuery finds the child job whose session is session. A child's
// session is named by its job (ChildSessionID), so the job is read by its
// key, and its spec must still name the session; any other name scans the
// child jobs (it names none, unless a database was edited).
func childJobQuery(session string) (string, []any) {
	if n, ok := strings.CutPrefix(session, "child-"); ok {
		if id, err := strconv.ParseInt(n, 10, 64); err == nil && id > 0 && ChildSessionID(id) == session {
			return `SELECT ` + jobColumns + ` FROM jobs WHERE id = ? AND kind = 'child' AND json_extract(spec, '$.session') = ?`, []any{id, session}
		}
	}
	return `SELECT ` + jobColumns + ` FROM jobs WHERE kind = 'child' AND json_extract(spec, '$.session') = ?`, []any{session}
}

// ChildJobOf returns the child job whose session is session, in the
// transaction; ErrNoJob when session is no child.
func (t *Tx) ChildJobOf(session string) (Job, error) {
	q, args := childJobQuery(session)
	j, err := scanJob(t.queryRow(q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fmt.Errorf("%w: session %s is no child", ErrNoJob, session)
	}
	return j, err
}

// ChildJobOf returns the child job whose session is session; ErrNoJob
// when session is no child.
func (s *Store) ChildJobOf(ctx context.Context, session string) (Job, error) {
	q, args := childJobQuery(session)
	j, err := scanJob(s.rdb.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fmt.Errorf("%w: session %s is no child", ErrNoJob, session)
	}
	return j, err
}

// ChildSpecOf decodes a child job's spec.
func ChildSpecOf(j Job) (ChildSpec, error) {
	var c ChildSpec
	if j.Kind != "child" {
		return c, fmt.Errorf("job %d is a %s, not a child", j.ID, j.Kind)
	}
	err := json.Unmarshal(j.Spec, &c)
	return c, err
}

// ChildSessions lists the sessions whose parent is id, oldest first.
func (s *Store) ChildSessions(ctx context.Context, id string) ([]Session, error) {
	rows, err := s.rdb.QueryContext(ctx, sessionSelect+` WHERE parent_id = ? ORDER BY created_at, id`, id)
	if err != nil {
		return nil, fmt.Errorf("children: %w", err)
	}
	defer rows.Close()
	out := []Session{}
	for rows.Next() {
		sess, err := scanSession(rows, "")
		if err != nil {
			return nil, err
		}
		out = append(out, sess)
	}
	return out, rows.Err()
}

// Depth returns how deep session id is in its tree (a root: 0) and its root.
func (s *Store) Depth(ctx context.Context, id string) (depth int, root string, err error) {
	err = s.rdb.QueryRowContext(ctx, ancestryQuery, id).Scan(&depth, &root)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	return depth, root, err
}

// Descendants counts the sessions under id, at any depth.
func (s *Store) Descendants(ctx context.Context, id string) (int, error) {
	var n int
	err := s.rdb.QueryRowContext(ctx, descendantsQuery, id).Scan(&n)
	return n, err
}

// EndChild ends the running child job of session: its state, result or
// error, a job.<state> event and, to the parent, notice as one input
// (deduplicated: a child ends once). It returns the job as ended.
func (t *Tx) EndChild(session string, to JobState, result json.RawMessage, errText, notice string) (Job, error) {
	return t.EndChildWith(session, JobEnd{To: to, Result: result, Error: errText, Notice: notice})
}

// EndChildWith is EndChild with e's artifact (a child's patch, on a worker
// host) recorded as the job's output; e.ID is the child's job's.
func (t *Tx) EndChildWith(session string, e JobEnd) (Job, error) {
	j, err := t.ChildJobOf(session)
	if err != nil {
		return j, err
	}
	if j.State != JobRunning {
		return j, fmt.Errorf("%w: child %d is %s", ErrJobState, j.ID, j.State)
	}
	e.ID = j.ID
	if err := t.EndJob(e); err != nil {
		return j, err
	}
	return t.Job(j.ID)
}

// RunningChildren lists the running child jobs parent owns, oldest first.
func (t *Tx) RunningChildren(parent string) ([]Job, error) {
	rows, err := t.query(`SELECT `+jobColumns+` FROM jobs WHERE kind = 'child' AND session_id = ? AND state = 'running' ORDER BY id`, parent)
	if err != nil {
		return nil, fmt.Errorf("running children: %w", err)
	}
	return scanJobs(rows, "running children")
}

// RunningChildJobs lists every running child job, oldest first (the wall
// time sweep).
func (s *Store) RunningChildJobs(ctx context.Context) ([]Job, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE kind = 'child' AND state = 'running' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("running children: %w", err)
	}
	return scanJobs(rows, "running children")
}

// childrenSpawnedSince counts the child jobs created since a time (unix
// ms): agents.max_spawns_per_day's count, on the index jobs_child_created.
const childrenSpawnedSince = `SELECT count(*) FROM jobs WHERE kind = 'child' AND created_at >= ?`

// spawnCaps refuses a spawn by parent (at depth) past the fan-out caps,
// counted from the child jobs in the store: each says which cap and when
// it resets.
func (t *Tx) spawnCaps(parent string, depth int, l ChildLimits) error {
	if l.MaxSpawnsPerDay > 0 && l.Day != nil {
		start, end := l.Day()
		var n int
		if err := t.queryRow(childrenSpawnedSince, start.UnixMilli()).Scan(&n); err != nil {
			return fmt.Errorf("spawn: %w", err)
		}
		if n >= l.MaxSpawnsPerDay {
			return fmt.Errorf("%w: %d children were spawned today, since %s (agents.max_spawns_per_day = %d); it resets %s: finish with the children you have",
				ErrChildBudget, n, start.Format("2006-01-02 15:04 MST"), l.MaxSpawnsPerDay, end.Format("2006-01-02 15:04 MST"))
		}
	}
	if l.MaxSpawnsPerTree > 0 && depth > 0 {
		// The tree is the subtree of the root's child parent is under.
		top := parent
		for range depth - 1 {
			s, err := t.Session(top)
			if err != nil {
				return fmt.Errorf("spawn: %w", err)
			}
			top = s.ParentID
		}
		var n int
		if err := t.queryRow(descendantsQuery, top).Scan(&n); err != nil {
			return fmt.Errorf("spawn: %w", err)
		}
		if n >= l.MaxSpawnsPerTree {
			return fmt.Errorf("%w: the tree of %s has spawned %d children (agents.max_spawns_per_tree = %d); it does not reset: finish with the children you have",
				ErrChildBudget, top, n, l.MaxSpawnsPerTree)
		}
	}
	return nil
}
