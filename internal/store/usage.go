package store

import (
	"context"
	"fmt"
)

// Usage is what a session's model requests cost, from what the store
// records of them: every model step its attempts recorded (completed, failed
// or cut off) and their prompt plus completion tokens as the provider
// reported them (a step without reported usage counts no tokens). The
// attempts carry these sums (RecordStep), read through their index by
// session. A tree's usage has no Session.
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

// TreeUsage sums the usage of every session under root, at any depth
// (root's own excluded): what agents.max_tree_tokens bounds.
func (s *Store) TreeUsage(ctx context.Context, root string) (Usage, error) {
	var u Usage
	err := s.rdb.QueryRowContext(ctx, treeUsageQuery, root).Scan(&u.Attempts, &u.ModelRequests, &u.Tokens)
	return u, err
}

func (t *Tx) treeUsage(root string) (Usage, error) {
	var u Usage
	err := t.queryRow(treeUsageQuery, root).Scan(&u.Attempts, &u.ModelRequests, &u.Tokens)
	return u, err
}

const treeUsageQuery = `WITH RECURSIVE down(id, depth) AS (
		SELECT id, 0 FROM sessions WHERE parent_id = ?
		UNION ALL SELECT s.id, down.depth + 1 FROM sessions s JOIN down ON s.parent_id = down.id WHERE down.depth < 1000)
	SELECT count(*), COALESCE(SUM(a.steps), 0), COALESCE(SUM(a.tokens), 0) FROM attempts a JOIN down ON a.session_id = down.id`
