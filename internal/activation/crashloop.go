package activation

import (
	"context"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// A release whose workers crash CrashLoopCount times within CrashLoopWindow
// of its activation is rolled back to the last good release by the host,
// without the model or any hook, with a notice naming it.
var (
	CrashLoopCount  = 3
	CrashLoopWindow = 5 * time.Minute
)

// WorkerCrashed records that a worker of session running release at epoch
// died unasked (not an interrupt or a reset) and rolls the session back when
// that makes a crash loop. It returns whether it rolled back.
func (s *Service) WorkerCrashed(ctx context.Context, session string, epoch int64, release, role, reason string) (bool, error) {
	if err := s.store.Write(ctx, func(tx *store.Tx) error {
		return tx.RecordWorkerCrash(session, epoch, release, role, reason)
	}); err != nil {
		return false, err
	}
	return s.checkCrashLoop(ctx, session, epoch, release)
}

func (s *Service) checkCrashLoop(ctx context.Context, session string, epoch int64, release string) (bool, error) {
	sess, err := s.store.Session(ctx, session)
	if err != nil || sess.BehaviorEpoch != epoch || sess.PolicyRevision != release {
		return false, err // moved on already: nothing to roll back
	}
	hist, err := s.store.Activations(ctx, session)
	if err != nil || len(hist) < 2 || hist[0].Epoch != epoch {
		return false, err // the first release has nothing earlier to return to
	}
	since := hist[0].ActivatedAt
	if time.Since(since) > CrashLoopWindow {
		return false, nil
	}
	n, err := s.store.WorkerCrashes(ctx, session, epoch, since)
	if err != nil || n < CrashLoopCount {
		return false, err
	}
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	reason := fmt.Sprintf("crash loop: the workers of release %s crashed %d times within %s of its activation at epoch %d; rolled back to the last good release",
		release[:12], n, CrashLoopWindow, epoch)
	res, err := s.rollbackFrom(ctx, session, epoch, release, reason)
	if err != nil {
		s.log.Error("crash loop: rollback failed", "session", session, "release", release, "error", err)
		return false, err
	}
	s.log.Warn("crash loop: rolled back", "session", session, "from", release, "to", res.Release, "epoch", res.Epoch)
	return true, nil
}

// rollbackFrom activates the newest earlier release other than bad that
// verifies and passes its check, over epoch.
func (s *Service) rollbackFrom(ctx context.Context, session string, epoch int64, bad, reason string) (Result, error) {
	history, err := s.store.Activations(ctx, session)
	if err != nil {
		return Result{}, err
	}
	tried := map[string]bool{bad: true}
	for _, a := range history {
		if tried[a.Release] {
			continue
		}
		tried[a.Release] = true
		if _, err := s.releases.Verify(a.Release); err != nil {
			continue
		}
		res, err := s.activate(ctx, session, epoch, a.Release, "rollback", fmt.Sprintf("%s (epoch %d's release)", reason, a.Epoch))
		if err == nil {
			return res, nil
		}
		s.log.Warn("crash loop: rollback candidate refused", "session", session, "release", a.Release, "error", err)
	}
	return Result{}, fmt.Errorf("session %s has no earlier good release to roll back to", session)
}
