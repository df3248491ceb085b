package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// A child agent is a session whose parent_id names the session that
// spawned it, and a job of kind child owned by that parent: the job carries
// the child's state and result, and its end wakes the parent once (EndJob).
// The job's spec names the child's session: {"session", "task", "refs",
// "delegate"}.

// ErrChildBudget refuses a spawn that would pass a limit of the tree.
var ErrChildBudget = errors.New("child budget exhausted")

// ChildLimits bound a session tree at spawn; zero fields do not bound.
type ChildLimits struct {
	MaxDepth       int // a root's children are at depth 1
	MaxDescendants int // sessions under the root, finished ones included
	MaxConcurrent  int // running children of one parent
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
	Priority int // job.plan's, recorded on the job
}

// ChildSpec is a child job's spec.
type ChildSpec struct {
	Session  string   `json:"session"`
	Task     string   `json:"task"`
	Refs     []string `json:"refs"`
	Delegate []string `json:"delegate"`
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
	spec, _ := json.Marshal(ChildSpec{Session: child, Task: c.Task, Refs: c.Refs, Delegate: c.Delegate})
	if _, err := t.exec(`UPDATE jobs SET spec = ? WHERE id = ?`, string(spec), id); err != nil {
		return Spawned{}, fmt.Errorf("spawn: %w", err)
	}
	if _, err := t.StartJob(id); err != nil {
		return Spawned{}, err
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
		Body: ChildTaskText(id, c.Parent, c.Task, c.Refs, c.Delegate)}); err != nil {
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

// ChildJobOf returns the child job whose session is session, in the
// transaction; ErrNoJob when session is no child.
func (t *Tx) ChildJobOf(session string) (Job, error) {
	j, err := scanJob(t.queryRow(`SELECT `+jobColumns+` FROM jobs WHERE kind = 'child' AND json_extract(spec, '$.session') = ?`, session))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fmt.Errorf("%w: session %s is no child", ErrNoJob, session)
	}
	return j, err
}

// ChildJobOf returns the child job whose session is session; ErrNoJob
// when session is no child.
func (s *Store) ChildJobOf(ctx context.Context, session string) (Job, error) {
	j, err := scanJob(s.rdb.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE kind = 'child' AND json_extract(spec, '$.session') = ?`, session))
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
	j, err := t.ChildJobOf(session)
	if err != nil {
		return j, err
	}
	if j.State != JobRunning {
		return j, fmt.Errorf("%w: child %d is %s", ErrJobState, j.ID, j.State)
	}
	if err := t.EndJob(JobEnd{ID: j.ID, To: to, Result: result, Error: errText, Notice: notice}); err != nil {
		return j, err
	}
	return t.Job(j.ID)
}
