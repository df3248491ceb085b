// Package activation changes what behavior a session runs: it checks a
// candidate release in a candidate hook worker, switches the session's
// epoch with a compare-and-swap, and replaces only the processes the change
// needs. It also boots sessions at startup, restoring the last good release
// when the active one is corrupt.
package activation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/pyenv"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Workbench is the part of the workbench manager an activation needs.
type Workbench interface {
	// ResetAtBoundary replaces the session's workbench before its next cell,
	// without waiting (the activation may come from the running cell).
	ResetAtBoundary(session, reason string)
}

// Preparer is a Workbench that can make a prepared switch: start the new
// generation under the candidate release, through its handshake, before the
// old one is told to stop (workbench.Manager is one).
type Preparer interface {
	Workbench
	// Prepare starts the replacement; it takes over at the next safe boundary.
	Prepare(ctx context.Context, session, release, reason string) error
	// Discard drops a prepared replacement that is not to be used.
	Discard(session, reason string)
	// Switch lets a prepared replacement take over now if no cell runs.
	Switch(ctx context.Context, session string) error
}

// Service activates releases.
type Service struct {
	store    *store.Store
	releases *behavior.Releases
	hooks    *hooks.Dispatcher
	bench    Workbench // nil when cells cannot run
	log      *slog.Logger
	env      envFacts
	envs     *pyenv.Envs // nil: releases that declare dependencies are refused
	crashMu  sync.Mutex  // one crash-loop rollback at a time
}

// New returns a Service.
func New(st *store.Store, rel *behavior.Releases, h *hooks.Dispatcher, bench Workbench, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{store: st, releases: rel, hooks: h, bench: bench, log: log}
}

// ErrCandidate marks a release refused by its check.
var ErrCandidate = errors.New("candidate release refused")

// Result is a completed activation.
type Result struct {
	Session  string        `json:"session"`
	Epoch    int64         `json:"epoch"`
	Release  string        `json:"release"`
	Kind     behavior.Kind `json:"kind"`
	Replaced []string      `json:"replaced"` // processes replaced: "hooks", "workbench"
	Took     time.Duration `json:"took_ns"`
}

// Publish stores a tree as a release and records it.
func (s *Service) Publish(ctx context.Context, m behavior.Manifest) error {
	b, _ := json.Marshal(m)
	return s.store.Write(ctx, func(tx *store.Tx) error { return tx.RecordRelease(m.ID, b) })
}

// Activate makes release the session's behavior, if the session is still
// at epoch parent. The candidate is checked in its own hook worker first; a
// refused candidate changes nothing.
func (s *Service) Activate(ctx context.Context, session string, parent int64, release, reason string) (Result, error) {
	return s.activate(ctx, session, parent, release, "", reason)
}

// activate is Activate with the recorded kind forced when override is set
// (rollback, restore).
func (s *Service) activate(ctx context.Context, session string, parent int64, release, override, reason string) (Result, error) {
	start := time.Now()
	res := Result{Session: session, Release: release}
	next, err := s.releases.Verify(release)
	if err != nil {
		return res, fmt.Errorf("%w: %v", ErrCandidate, err)
	}
	if err := s.Publish(ctx, next); err != nil {
		return res, err
	}
	sess, err := s.store.Session(ctx, session)
	if err != nil {
		return res, err
	}
	if sess.BehaviorEpoch != parent {
		return res, fmt.Errorf("%w: %s is at epoch %d, not %d", store.ErrStaleEpoch, session, sess.BehaviorEpoch, parent)
	}
	res.Kind = behavior.KindWorkbench // a first activation starts everything fresh
	if sess.PolicyRevision != "" {
		if cur, err := s.releases.Verify(sess.PolicyRevision); err == nil {
			res.Kind = behavior.ActivationKind(cur.Components, next.Components)
		}
	}
	// A prompt-only change replaces no process: its hooks are the running
	// ones, so there is nothing to check in a candidate either.
	promptOnly := parent != 0 && (res.Kind == behavior.KindPrompt || res.Kind == behavior.KindNone)
	var cand *worker.Worker
	var rep Report
	if !promptOnly {
		if cand, rep, err = s.check(ctx, session, release); err != nil {
			return res, err
		}
	}
	// A workbench-kind change starts the new generation first: if it cannot
	// start, the old one keeps serving and the activation is refused.
	why := fmt.Sprintf("behavior epoch %d (%s) changed skills or environment", parent+1, release[:12])
	prep, prepared := s.bench.(Preparer)
	prepared = prepared && res.Kind == behavior.KindWorkbench && parent != 0
	if prepared {
		if err := prep.Prepare(ctx, session, release, why); err != nil {
			cand.Stop()
			rep.OK, rep.Refused = false, "its workbench generation did not start (the current one keeps serving): "+err.Error()
			s.record(ctx, session, rep)
			return res, fmt.Errorf("%w: %s", ErrCandidate, rep.Refused)
		}
	}
	kind := string(res.Kind)
	if parent == 0 {
		kind = "initial"
	}
	if override != "" {
		kind = override
	}
	if err := s.store.Write(ctx, func(tx *store.Tx) (err error) {
		res.Epoch, err = tx.Activate(session, parent, release, kind, reason)
		return err
	}); err != nil {
		if cand != nil {
			cand.Stop()
		}
		if prepared {
			prep.Discard(session, "prepared for an activation that did not happen: "+err.Error())
		}
		return res, err
	}
	if promptOnly {
		s.hooks.Repin(session, release, res.Epoch)
		res.Took = time.Since(start)
		return res, nil
	}
	// Switch the processes the change needs. The hook worker is swapped for
	// the checked candidate (old invocations finish on the old one); the
	// workbench is replaced only when skills or the environment changed: by
	// the generation prepared above, now or when the running cell ends.
	s.hooks.Swap(session, cand, release, res.Epoch)
	if res.Kind == behavior.KindHooks || res.Kind == behavior.KindWorkbench {
		res.Replaced = append(res.Replaced, "hooks")
	}
	if res.Kind == behavior.KindWorkbench && s.bench != nil && parent != 0 {
		if !prepared {
			s.bench.ResetAtBoundary(session, why)
		} else if err := prep.Switch(ctx, session); err != nil {
			s.log.Warn("the prepared workbench generation could not take over yet; it does before the next cell", "session", session, "error", err)
		}
		res.Replaced = append(res.Replaced, "workbench")
	}
	res.Took = time.Since(start)
	return res, nil
}

// check validates release for session with the host's suite (see
// Validate), stores the report with the release, and returns the candidate's
// hook worker ready to serve. The candidate's own claims count for nothing:
// only the host's reading of its answers does.
func (s *Service) check(ctx context.Context, session, release string) (*worker.Worker, Report, error) {
	rep, w, err := s.Validate(ctx, session, release)
	s.record(ctx, session, rep)
	return w, rep, err
}

// checkSlots starts release's hook worker and has every required slot
// answer its fixture well (a restart's check of the active release: it was
// validated when it was activated); the worker is returned ready to serve.
func (s *Service) checkSlots(ctx context.Context, session, release string) (*worker.Worker, error) {
	w, err := s.hooks.StartWorker(ctx, session, release)
	if err != nil {
		return nil, fmt.Errorf("%w: its hook worker did not start: %v", ErrCandidate, err)
	}
	// Every slot the registry has a fixture for, and the release's [hooks]
	// binding (hooks.CheckCandidate).
	if err := hooks.CheckCandidate(ctx, w, s.releases.Tree(release)); err != nil {
		w.Kill()
		return nil, fmt.Errorf("%w: %v", ErrCandidate, err)
	}
	return w, nil
}

// Rollback activates the release of the newest earlier epoch that still
// verifies. It changes future behavior only: nothing sent is unsent.
func (s *Service) Rollback(ctx context.Context, session string) (Result, error) {
	sess, err := s.store.Session(ctx, session)
	if err != nil {
		return Result{}, err
	}
	history, err := s.store.Activations(ctx, session)
	if err != nil {
		return Result{}, err
	}
	for _, a := range history {
		if a.Release == sess.PolicyRevision {
			continue
		}
		if _, err := s.releases.Verify(a.Release); err != nil {
			continue
		}
		return s.activate(ctx, session, sess.BehaviorEpoch, a.Release, "rollback",
			fmt.Sprintf("rollback to the release of epoch %d", a.Epoch))
	}
	return Result{}, fmt.Errorf("session %s has no earlier release to roll back to", session)
}

// Boot gives a session with no behavior the default release, and restores
// the last good release when the active one no longer verifies (or fails
// its check), recording why. No model is involved.
func (s *Service) Boot(ctx context.Context, session, defaultRelease string) (Result, error) {
	sess, err := s.store.Session(ctx, session)
	if err != nil {
		return Result{}, err
	}
	if sess.PolicyRevision == "" {
		return s.Activate(ctx, session, sess.BehaviorEpoch, defaultRelease, "initial behavior")
	}
	_, verr := s.releases.Verify(sess.PolicyRevision)
	if verr == nil {
		// Its environment, if it declares one, exists before any generation
		// of it starts (it is never resolved at launch).
		if _, err := s.stageEnv(ctx, sess.PolicyRevision); err != nil {
			s.log.Error("the active release's environment cannot be staged", "session", session, "error", err)
		}
		// The bytes are right; the release must also still start and answer
		// (an interpreter upgrade can break an import). Its worker becomes
		// the session's hook worker.
		w, err := s.checkSlots(ctx, session, sess.PolicyRevision)
		if err == nil {
			s.hooks.Swap(session, w, sess.PolicyRevision, sess.BehaviorEpoch)
			return Result{Session: session, Epoch: sess.BehaviorEpoch, Release: sess.PolicyRevision, Kind: behavior.KindNone}, nil
		}
		verr = err
	}
	s.log.Error("active behavior release is corrupt or failing; restoring the last good one", "session", session, "release", sess.PolicyRevision, "error", verr)
	history, err := s.store.Activations(ctx, session)
	if err != nil {
		return Result{}, err
	}
	candidates := []string{}
	for _, a := range history {
		if a.Release != sess.PolicyRevision {
			candidates = append(candidates, a.Release)
		}
	}
	candidates = append(candidates, defaultRelease)
	for _, rel := range candidates {
		res, err := s.activate(ctx, session, sess.BehaviorEpoch, rel, "restore",
			fmt.Sprintf("restored at startup: release %s failed verification or its check (%v)", sess.PolicyRevision[:12], verr))
		if err == nil {
			return res, nil
		}
		s.log.Warn("restore candidate refused", "session", session, "release", rel, "error", err)
	}
	return Result{}, fmt.Errorf("session %s: no release could be restored", session)
}

// TestTimeout bounds a candidate's own test suite.
const TestTimeout = 2 * time.Minute
