package store

import (
	"context"
	"fmt"
)

// Usage is what a session's model requests cost, from what the store
// records of them: every model step its attempts recorded (completed, failed
// or cut off) and their prompt plus completion tokens as the provider
// reported them (a step without reported usage counts no tokens).
type Usage struct {
	Session       string `json:"session"`
	ModelRequests int64  `json:"model_requests"`
	Tokens        int64  `json:"tokens"`
	Attempts      int64  `json:"attempts"`
}

// SessionUsage sums the usage of session's attempts (ErrUnknownSession
// when there is no such session).
func (s *Store) SessionUsage(ctx context.Context, session string) (Usage, error) {
	u := Usage{Session: session}
	var known int
	err := s.rdb.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sessions WHERE id = ?),
		count(*), COALESCE(SUM(steps), 0), COALESCE(SUM(tokens), 0) FROM attempts WHERE session_id = ?`, session, session).
		Scan(&known, &u.Attempts, &u.ModelRequests, &u.Tokens)
	if err != nil {
		return u, fmt.Errorf("session usage: %w", err)
	}
	if known == 0 {
		return u, fmt.Errorf("%w: %s", ErrUnknownSession, session)
	}
	return u, nil
}
