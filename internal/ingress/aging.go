package ingress

import (
	"context"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// StartAging ignores attention items left pending longer than after, with
// decision_origin aging (the compatibility default is 600 s): the record
// says time passed, not that anyone read them. It runs until Close; a second
// call does nothing. The timer sleeps until the oldest pending item falls
// due, and is woken when a new item is admitted.
func (s *Server) StartAging(after time.Duration) {
	if after <= 0 {
		return
	}
	s.agingOnce.Do(func() {
		s.agingDone = make(chan struct{})
		go s.age(after)
	})
}

func (s *Server) age(after time.Duration) {
	defer close(s.agingDone)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-s.itemAdmitted:
		case <-timer.C:
		}
		next, err := s.ageOnce(after)
		if err != nil {
			s.cfg.Log.Warn("pending aging", "error", err)
			next = s.cfg.Clock().Add(time.Minute)
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(next.Sub(s.cfg.Clock()), 0))
		}
	}
}

// ageOnce ages what is due and returns when the oldest remaining pending
// item falls due (zero: none is pending).
func (s *Server) ageOnce(after time.Duration) (time.Time, error) {
	ctx := context.Background()
	oldest, ok, err := s.cfg.Store.OldestPendingItem(ctx)
	if err != nil || !ok {
		return time.Time{}, err
	}
	now := s.cfg.Clock()
	if due := oldest.Add(after); due.After(now) {
		return due, nil
	}
	var n int64
	note := fmt.Sprintf("pending for more than %s without a decision", after)
	if err := s.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		n, err = tx.AgePending(now.Add(-after), note)
		return err
	}); err != nil {
		return time.Time{}, err
	}
	s.cfg.Log.Info("pending aging: items ignored by aging", "items", n)
	oldest, ok, err = s.cfg.Store.OldestPendingItem(ctx)
	if err != nil || !ok {
		return time.Time{}, err
	}
	return oldest.Add(after), nil
}
