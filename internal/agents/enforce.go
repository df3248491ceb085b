package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/budget"
	"github.com/klbr-dev/klbr/internal/store"
)

// ErrExhausted is a child's spent budget: it was ended before its next
// model request.
var ErrExhausted = errors.New("budget exhausted")

// ErrEnded refuses a model request of a child whose job has ended.
var ErrEnded = errors.New("the child has ended")

// ended is a child ended by one endTree.
type endedChild struct {
	job     int64
	session string
	stopped bool // its session was stopped (its kernel is stopped in any case)
}

// endTree ends session's child job (to, result, errText; how is said in
// the parent's notice) and, in the same transaction, cancels each of its
// running descendants (each parent told once, each session stopped). stop
// stops session too. After the commit, whoever waits for them is told, and
// the kernels of the stopped sessions are stopped.
func (a *Agents) endTree(ctx context.Context, session string, to store.JobState, result json.RawMessage, errText, how string, stop bool) (store.Job, error) {
	var j store.Job
	var ended []endedChild
	// A child on a host: its changes come back before its end is committed,
	// so the end records the patch and the parent's notice names it.
	patch, note := a.hostPatch(ctx, session)
	below := a.hostPatchesBelow(ctx, session)
	err := a.cfg.Store.Write(ctx, func(tx *store.Tx) error {
		ended = ended[:0]
		cur, err := tx.ChildJobOf(session)
		if err != nil {
			return err
		}
		if j, err = tx.EndChildWith(session, store.JobEnd{To: to, Result: result, Error: errText,
			Artifact: patch.Ref, ArtifactSize: patch.Size, Notice: Notice(cur.ID, session, to, how, result, errText) + note}); err != nil {
			return err
		}
		ended = append(ended, endedChild{job: j.ID, session: session, stopped: stop})
		if stop {
			if err := stopSession(tx, session, fmt.Sprintf("child %d ended %s: %s", j.ID, to, how)); err != nil {
				return err
			}
		}
		return cancelBelow(tx, session, &ended, below)
	})
	if err == nil {
		a.after(ctx, ended)
	}
	return j, err
}

// cancelBelow cancels parent's running children and theirs, depth first;
// a child on a host records its patch from patches (hostPatchesBelow).
func cancelBelow(tx *store.Tx, parent string, ended *[]endedChild, patches map[string]hostPatchNote) error {
	kids, err := tx.RunningChildren(parent)
	if err != nil {
		return err
	}
	for _, k := range kids {
		spec, err := store.ChildSpecOf(k)
		if err != nil {
			return err
		}
		how := fmt.Sprintf("cancelled with its parent %s", parent)
		p := patches[spec.Session]
		if _, err := tx.EndChildWith(spec.Session, store.JobEnd{To: store.JobCancelled, Error: "cancelled: its parent " + parent + " ended or was stopped",
			Artifact: p.patch.Ref, ArtifactSize: p.patch.Size, Notice: Notice(k.ID, spec.Session, store.JobCancelled, how, nil, "") + p.note}); err != nil {
			return err
		}
		if err := stopSession(tx, spec.Session, fmt.Sprintf("child %d was %s", k.ID, how)); err != nil {
			return err
		}
		*ended = append(*ended, endedChild{job: k.ID, session: spec.Session, stopped: true})
		if err := cancelBelow(tx, spec.Session, ended, patches); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agents) after(ctx context.Context, ended []endedChild) {
	for _, e := range ended {
		a.collect(ctx, e)
		a.ended(e.job)
		// Every ended child's kernel goes: an ended child runs no more cells
		// (its session would be stopped if anything woke it), and an idle
		// kernel holds its memory. The reset waits for the finishing cell.
		if a.cfg.StopKernel != nil {
			a.cfg.StopKernel(e.session, fmt.Sprintf("child %d ended: its kernel is stopped with it", e.job))
		}
	}
}

// Stopped is told that the operator stopped session: its running children
// (and theirs) are cancelled, each parent told once, so that no child goes
// on spending under a stopped parent.
func (a *Agents) Stopped(ctx context.Context, session string) {
	var ended []endedChild
	below := a.hostPatchesBelow(ctx, session)
	err := a.cfg.Store.Write(ctx, func(tx *store.Tx) error {
		ended = ended[:0]
		return cancelBelow(tx, session, &ended, below)
	})
	if err == nil {
		a.after(ctx, ended)
	}
}

// limit is one bound of a child's budget and what it has used.
type limit struct {
	what  string // "tokens", "wall time", …
	key   string // the key that set it
	used  float64
	limit float64
	unit  string
	owner string // the child above whose budget it is ("": the checked one's)
}

func (l limit) spent() bool { return l.used >= l.limit }

func (l limit) String() string {
	key := l.key
	if l.owner != "" {
		key += " of " + l.owner
	}
	return fmt.Sprintf("%s %s of %s (%s)", l.what, l.amount(l.used), l.amount(l.limit), key)
}

// usdUnit is the unit of a limit in dollars (budget.usd).
const usdUnit = " USD"

// amount is f in l's unit: dollars to the cent's hundredth, else as num.
func (l limit) amount(f float64) string {
	if l.unit == usdUnit {
		return fmt.Sprintf("%.4g%s", f, l.unit)
	}
	return num(f) + l.unit
}

func num(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%d", int64(f))
	}
	return fmt.Sprintf("%.1f", f)
}

// Check is asked before each model request of a child agent's session
// (turn.Config.Check): a child whose budget, or whose tree's, is spent is
// ended failed with the reason and a result saying so (its parent told
// once, its session and kernel stopped, its running children cancelled),
// and the request is refused. A child's budget covers its whole subtree,
// so the budget of every child above session is checked too: one that is
// spent ends that child, and session with it (the cancellation cascades).
// A child whose job has already ended makes no more requests: its session
// is stopped.
func (a *Agents) Check(ctx context.Context, session string) error {
	j, err := a.cfg.Store.ChildJobOf(ctx, session)
	if errors.Is(err, store.ErrNoJob) {
		return nil
	}
	if err != nil {
		return err
	}
	if j.State != store.JobRunning {
		_ = a.cfg.Store.Write(ctx, func(tx *store.Tx) error {
			return stopSession(tx, session, fmt.Sprintf("child %d has ended (%s): it makes no more model requests", j.ID, j.State))
		})
		return fmt.Errorf("%w: child %d is %s; it makes no more model requests", ErrEnded, j.ID, j.State)
	}
	links, err := chain(ctx, a.cfg.Store, session)
	if err != nil {
		return err
	}
	for i, l := range links {
		if l.job.State != store.JobRunning {
			// Its ended ancestor's cancellation missed it: nothing runs under an ended child.
			how := fmt.Sprintf("cancelled: %s above it has ended (%s)", l.session, l.job.State)
			if _, err := a.endTree(ctx, session, store.JobCancelled, nil, how, how, true); err != nil && !errors.Is(err, store.ErrJobState) {
				return err
			}
			return fmt.Errorf("%w: %s; it makes no more model requests", ErrEnded, how)
		}
		limits, err := a.limits(ctx, l.session, l.job, true)
		if err != nil {
			return err
		}
		if i == 0 {
			tree, err := a.treeLimit(ctx, session)
			if err != nil {
				return err
			}
			limits = append(limits, tree...)
		}
		for _, lim := range limits {
			if !lim.spent() {
				continue
			}
			if err := a.exhaust(ctx, l.session, session, l.job, lim); i == 0 || !errors.Is(err, ErrExhausted) {
				return err
			}
			lim.owner = l.session
			return fmt.Errorf("%w: %s; %s was ended with it", ErrExhausted, lim, session)
		}
	}
	return nil
}

// limits are child job j's bounds with what it used; usage also reads the
// recorded tokens and requests of its whole subtree (its own and every
// descendant's: a child's budget covers them); the wall time needs none.
func (a *Agents) limits(ctx context.Context, session string, j store.Job, usage bool) ([]limit, error) {
	b, err := budget.Parse(j.Budget)
	if err != nil {
		b = budget.Budget{} // recorded by an older klbr-core: only the tree's limits hold
	}
	var out []limit
	if wall, key := a.wall(b); wall > 0 && j.StartedAt != nil {
		out = append(out, limit{what: "wall time", key: key, used: a.cfg.Clock().Sub(*j.StartedAt).Seconds(), limit: wall.Seconds(), unit: "s"})
	}
	if !usage || (b.Tokens == nil && b.ModelRequests == nil && b.USD == nil) {
		return out, nil
	}
	if b.USD != nil {
		usd, err := a.cfg.Store.SubtreeSpendUSD(ctx, session)
		if err != nil {
			return nil, err
		}
		out = append(out, limit{what: "spend", key: "budget.usd", used: usd, limit: *b.USD, unit: usdUnit})
	}
	u, err := a.cfg.Store.SessionUsage(ctx, session)
	if err != nil {
		return nil, err
	}
	below, err := a.cfg.Store.TreeUsage(ctx, session)
	if err != nil {
		return nil, err
	}
	u.Tokens += below.Tokens
	u.ModelRequests += below.ModelRequests
	if b.Tokens != nil {
		out = append(out, limit{what: "tokens", key: "budget.tokens", used: float64(u.Tokens), limit: float64(*b.Tokens)})
	}
	if b.ModelRequests != nil {
		out = append(out, limit{what: "model requests", key: "budget.model_requests", used: float64(u.ModelRequests), limit: float64(*b.ModelRequests)})
	}
	return out, nil
}

// treeLimit is agents.max_tree_tokens with what session's tree used
// (none when it is not set).
func (a *Agents) treeLimit(ctx context.Context, session string) ([]limit, error) {
	max := a.cfg.Limits.MaxTreeTokens
	if max <= 0 {
		return nil, nil
	}
	_, root, err := a.cfg.Store.Depth(ctx, session)
	if err != nil {
		return nil, err
	}
	u, err := a.cfg.Store.TreeUsage(ctx, root)
	if err != nil {
		return nil, err
	}
	return []limit{{what: "tree tokens", key: "agents.max_tree_tokens", used: float64(u.Tokens), limit: float64(max)}}, nil
}

// wall is a child's wall time bound and the key that set it.
func (a *Agents) wall(b budget.Budget) (time.Duration, string) {
	d, key := a.cfg.MaxChildWall, "agents.max_child_wall_seconds"
	if b.WallSeconds != nil {
		if w := time.Duration(*b.WallSeconds * float64(time.Second)); d <= 0 || w < d {
			d, key = w, "budget.wall_seconds"
		}
	}
	return d, key
}

// budgetNote is what a child is told of its budget at spawn: its own
// limits and its wall time (the tighter of budget.wall_seconds and
// agents.max_child_wall_seconds), so it can finish in time.
func (a *Agents) budgetNote(raw json.RawMessage) string {
	b, err := budget.Parse(raw)
	if err != nil {
		return ""
	}
	var parts []string
	if b.Tokens != nil {
		parts = append(parts, fmt.Sprintf("%d model tokens", *b.Tokens))
	}
	if b.ModelRequests != nil {
		parts = append(parts, fmt.Sprintf("%d model requests", *b.ModelRequests))
	}
	if b.USD != nil {
		parts = append(parts, fmt.Sprintf("%.4g USD of model requests", *b.USD))
	}
	if d, _ := a.wall(b); d > 0 {
		parts = append(parts, fmt.Sprintf("%s of wall time from now", d.Round(time.Second)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "\n\nYour budget: at most " + strings.Join(parts, ", ") + ". Past it you are ended failed before your next model " +
		"request, so finish with what you have before: a partial result is worth more than none."
}

// exhaust ends child job j failed by spent limit l.
// by is the session whose model request is next: session, or a
// descendant (session's budget covers its subtree).
func (a *Agents) exhaust(ctx context.Context, session, by string, j store.Job, l limit) error {
	reason := "budget exhausted: " + l.String()
	when := "its next model request"
	if by != session {
		reason += ", its children's use included"
		when = "the next model request of " + by + ", under it"
	}
	used := math.Round(l.used*10) / 10
	if l.unit == usdUnit {
		used = math.Round(l.used*1e6) / 1e6
	}
	res, _ := json.Marshal(map[string]any{"budget_exhausted": l.key, "used": used, "limit": l.limit,
		"note": fmt.Sprintf("child %d was ended before %s: %s", j.ID, when, reason)})
	if _, err := a.endTree(ctx, session, store.JobFailed, res, reason, "budget exhausted", true); err != nil && !errors.Is(err, store.ErrJobState) {
		return err
	}
	return fmt.Errorf("%w: %s", ErrExhausted, l.String())
}

// Run ends every running child past its wall time, now and whenever one's
// falls due, even while it idles or waits (the deadline is its job's start
// plus its bound, so it holds across restarts), until Close.
func (a *Agents) Run() {
	defer close(a.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := a.sweep()
		t.Stop()
		if !next.IsZero() {
			t.Reset(max(time.Until(next), 0))
		}
		select {
		case <-a.stop:
			return
		case <-a.kick:
		case <-t.C:
		}
	}
}

// Close stops Run.
func (a *Agents) Close() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
}

func (a *Agents) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// sweep ends the running children past their wall time and returns the
// next deadline (zero: none).
func (a *Agents) sweep() time.Time {
	ctx := context.Background()
	js, err := a.cfg.Store.RunningChildJobs(ctx)
	if err != nil {
		return a.cfg.Clock().Add(time.Minute)
	}
	var next time.Time
	for _, j := range js {
		spec, err := store.ChildSpecOf(j)
		if err != nil {
			continue
		}
		ls, _ := a.limits(ctx, spec.Session, j, false)
		for _, l := range ls {
			if l.spent() {
				_ = a.exhaust(ctx, spec.Session, spec.Session, j, l)
				continue
			}
			due := j.StartedAt.Add(time.Duration(l.limit * float64(time.Second)))
			if next.IsZero() || due.Before(next) {
				next = due
			}
		}
	}
	return next
}

// collect brings an ended child's branch back into the workspace's
// repository (workspace.Collect), before its parent hears of the end, so
// the parent can merge it at once; a failure is logged, and removing the
// worktree tries again (and keeps it when it fails).
func (a *Agents) collect(ctx context.Context, e endedChild) {
	ws := a.cfg.Workspaces
	if ws == nil {
		return
	}
	p, err := ws.For(ctx, e.session)
	if err != nil || p.Mode != store.WorkspaceWorktree || p.Kind != "git" || p.GitDir != "" {
		return
	}
	if err := ws.Collect(context.WithoutCancel(ctx), p); err != nil && a.cfg.Log != nil {
		a.cfg.Log.Warn("child's branch not brought back", "job", e.job, "branch", p.Branch, "error", err)
	}
}
