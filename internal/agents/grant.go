package agents

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/budget"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Delegation narrows down the tree: what a session holds is the
// intersection of every grant on its way up to its root, and a child may
// grant its own children only what it holds. This file is the one place
// that says so; the spawn (narrow), a send (Delegated) and a model request
// (Check) all read the chain of spawners here, so a grant stored wider
// than its spawner's (by an older klbr-core, or a hand edit) is refused at
// use too.
//
// What is held:
//   - speech: a root holds every delegable op; a child, the ops delegated
//     at every spawn from its root down to it;
//   - budget: a child's budget covers its whole subtree (its own model
//     requests and every descendant's), and a child gives a child at most
//     what is left of its own and of every budget above it;
//   - workspace: a read-only place passes on read-only (workspace.Inherit)
//     and gives no worktree (workspace.Make), which the spawn asks for;
//   - evidence: a ref is granted only if the spawner may see it itself
//     (Config.GrantRef).

// maxChain bounds the walk from a session up to its root
// (agents.max_depth is at most 16; a longer chain is a damaged store).
const maxChain = 64

// link is one child on the way from a session up to its root.
type link struct {
	session string
	job     store.Job
	spec    store.ChildSpec
}

// errNoSession is chain's error for a session the store does not know.
var errNoSession = errors.New("no such session")

// chain returns the children from session up to its root, session's own
// first (empty for a root). A child session without its child job, or a
// job whose spec does not decode, is an error: such a session holds
// nothing.
func chain(ctx context.Context, st *store.Store, session string) ([]link, error) {
	var out []link
	for s := session; ; {
		sess, err := st.Session(ctx, s)
		if err != nil {
			if len(out) == 0 {
				return nil, fmt.Errorf("%w: %s: %v", errNoSession, s, err)
			}
			return nil, fmt.Errorf("the spawners of %s: %w", session, err)
		}
		if sess.ParentID == "" {
			return out, nil
		}
		if len(out) >= maxChain {
			return nil, fmt.Errorf("the spawners of %s: more than %d levels", session, maxChain)
		}
		j, err := st.ChildJobOf(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("the spawners of %s: %w", session, err)
		}
		spec, err := store.ChildSpecOf(j)
		if err != nil {
			return nil, fmt.Errorf("the spawners of %s: job %d: %w", session, j.ID, err)
		}
		out = append(out, link{session: s, job: j, spec: spec})
		s = sess.ParentID
	}
}

// heldOps are the speech ops the session at the head of links holds.
func heldOps(links []link) []string {
	out := slices.Clone(Delegable)
	for _, l := range links {
		out = slices.DeleteFunc(out, func(op string) bool { return !slices.Contains(l.spec.Delegate, op) })
	}
	return out
}

// heldText says what a session holds of speech, for an error.
func heldText(ops []string) string {
	if len(ops) == 0 {
		return "no speech (it was delegated none)"
	}
	return strings.Join(ops, ", ")
}

// narrowDelegate refuses a spawn by session (whose chain is links) that
// would grant a speech op session does not hold; fromProfile are the ops
// a profile added (named as the profile's in the error).
func narrowDelegate(session string, links []link, delegate []string, profile string, fromProfile []string) error {
	held := heldOps(links)
	for _, op := range delegate {
		if slices.Contains(held, op) {
			continue
		}
		what := session + " cannot delegate " + op
		if profile != "" && slices.Contains(fromProfile, op) {
			what = fmt.Sprintf("profile %q delegates %s, which %s cannot pass on", profile, op, session)
		}
		return &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
			"agents.spawn: %s: %s holds %s, and a child may grant its children only what it holds; "+
				"spawn without it (the child reports through its result), or ask the parent to delegate it",
			what, session, heldText(held))}
	}
	return nil
}

// narrowBudget returns b narrowed to what is left of every budget on the
// spawner's chain (links), each of which covers its whole subtree; a spent
// one refuses the spawn.
func (a *Agents) narrowBudget(ctx context.Context, links []link, b budget.Budget) (budget.Budget, error) {
	for _, l := range links {
		ls, err := a.limits(ctx, l.session, l.job, true)
		if err != nil {
			return b, &worker.RequestError{Code: "failed", Message: "agents.spawn: " + err.Error()}
		}
		for _, lim := range ls {
			left := lim.limit - lim.used
			spent := left < 1
			switch lim.unit {
			case "s":
				left = math.Floor(left*10) / 10
				spent = left <= 0
			case usdUnit:
				left = math.Floor(left*1e6) / 1e6
				spent = left <= 0
			}
			if spent {
				return b, &worker.RequestError{Code: "refused", Message: fmt.Sprintf(
					"agents.spawn: refused: %s of %s is spent (%s %s of %s, its children's use included): it has nothing left to give a child; "+
						"finish with what you have", lim.key, l.session, lim.what, lim.amount(lim.used), lim.amount(lim.limit))}
			}
			var rem budget.Budget
			switch lim.what {
			case "tokens":
				n := int64(left)
				rem.Tokens = &n
			case "model requests":
				n := int64(left)
				rem.ModelRequests = &n
			case "wall time":
				rem.WallSeconds = &left
			case "spend":
				rem.USD = &left
			}
			b = b.Narrow(rem)
		}
	}
	return b, nil
}

// narrow makes a spawn by session grant no more than session holds: its
// delegated ops (asked: the spawn's own; the rest came with its profile)
// must be held, and its budget is narrowed to what is left above it. It
// is asked after the profile is applied, before job.plan (which sees the
// narrowed spawn).
func (a *Agents) narrow(ctx context.Context, session string, args *spawnArgs, c *store.NewChild, asked []string) error {
	links, err := chain(ctx, a.cfg.Store, session)
	if err != nil {
		return &worker.RequestError{Code: "failed", Message: "agents.spawn: " + err.Error()}
	}
	if len(links) == 0 {
		return nil // a root holds everything
	}
	fromProfile := slices.DeleteFunc(slices.Clone(args.Delegate), func(op string) bool { return slices.Contains(asked, op) })
	if err := narrowDelegate(session, links, args.Delegate, args.Profile, fromProfile); err != nil {
		return err
	}
	own, err := budget.Parse(args.Budget) // parseSpawn and applyProfile made it
	if err != nil {
		return invalid("agents.spawn: %v", err)
	}
	if own, err = a.narrowBudget(ctx, links, own); err != nil {
		return err
	}
	args.Budget = own.JSON()
	c.Budget = args.Budget
	return nil
}
