package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SessionState is a session's lifecycle state. The legal moves between states
// are enforced by the schema and described by package session.
type SessionState string

// The lifecycle states.
const (
	StateReady   SessionState = "ready"
	StateRunning SessionState = "running"
	StateWaiting SessionState = "waiting"
	StatePaused  SessionState = "paused"
	StateStopped SessionState = "stopped"
)

// States lists every lifecycle state.
var States = []SessionState{StateReady, StateRunning, StateWaiting, StatePaused, StateStopped}

// Errors callers branch on.
var (
	ErrUnknownSession    = errors.New("unknown session")
	ErrSessionExists     = errors.New("session already exists")
	ErrIllegalTransition = errors.New("illegal session transition")
	ErrStaleState        = errors.New("session state changed concurrently")
	ErrSessionStopped    = errors.New("session is stopped")
)

// Session is the current operational state of one session.
type Session struct {
	ID             string       `json:"id"`
	ParentID       string       `json:"parent_id,omitempty"`
	State          SessionState `json:"state"`
	StateReason    string       `json:"state_reason,omitempty"`
	ContextEpoch   int64        `json:"context_epoch"`
	PolicyRevision string       `json:"policy_revision"`
	KernelGen      int64        `json:"kernel_generation"`
	BehaviorEpoch  int64        `json:"behavior_epoch"`
	CreatedAt      time.Time    `json:"created_at"`
	UpdatedAt      time.Time    `json:"updated_at"`
}

// CreateSession inserts a session in state ready. parent may be empty.
func (t *Tx) CreateSession(id, parent string) error {
	var p any
	if parent != "" {
		p = parent
	}
	now := t.now.UnixMilli()
	_, err := t.exec(`INSERT INTO sessions (id, parent_id, created_at, updated_at) VALUES (?, ?, ?, ?)`, id, p, now, now)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") {
		return fmt.Errorf("%w: %s", ErrSessionExists, id)
	}
	if err != nil {
		return fmt.Errorf("create session %s: %w", id, err)
	}
	return nil
}

// EnsureSession creates the session if it does not exist.
func (t *Tx) EnsureSession(id string) (created bool, err error) {
	res, err := t.exec(`INSERT INTO sessions (id, created_at, updated_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		id, t.now.UnixMilli(), t.now.UnixMilli())
	if err != nil {
		return false, fmt.Errorf("ensure session %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// sessionState reads a session's state, once per transaction.
func (t *Tx) sessionState(id string) (SessionState, error) {
	if st, ok := t.stmts.states[id]; ok {
		return st, nil
	}
	var st SessionState
	if err := t.queryRow(`SELECT state FROM sessions WHERE id = ?`, id).Scan(&st); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return "", fmt.Errorf("%w: %s", ErrUnknownSession, id)
		}
		return "", fmt.Errorf("read session %s: %w", id, err)
	}
	t.stmts.states[id] = st
	return st, nil
}

// Session reads one session inside the transaction.
func (t *Tx) Session(id string) (Session, error) {
	return scanSession(t.queryRow(sessionSelect+` WHERE id = ?`, id), id)
}

// TransitionSession moves a session from one state to another, compare-and-swap
// on from, and appends a notice record of the move. An illegal move returns
// ErrIllegalTransition; a session no longer in from returns ErrStaleState.
func (t *Tx) TransitionSession(id string, from, to SessionState, reason string) error {
	if from == to {
		return fmt.Errorf("%w: %s is already %s", ErrIllegalTransition, id, to)
	}
	delete(t.stmts.states, id)
	res, err := t.exec(`UPDATE sessions SET state = ?, state_reason = ?, updated_at = ? WHERE id = ? AND state = ?`,
		to, reason, t.now.UnixMilli(), id, from)
	if err != nil {
		if strings.Contains(err.Error(), "illegal session transition") {
			return fmt.Errorf("%w: %s cannot go from %s to %s", ErrIllegalTransition, id, from, to)
		}
		return fmt.Errorf("transition session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		cur, err := t.Session(id)
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: %s is %s, not %s", ErrStaleState, id, cur.State, from)
	}
	content, _ := json.Marshal(map[string]string{"from": string(from), "to": string(to), "reason": reason})
	_, _, err = t.appendItem(id, "session."+string(to), LaneNotice, string(content), t.now, t.now)
	t.controlled(id)
	return err
}

const sessionSelect = `SELECT id, COALESCE(parent_id, ''), state, state_reason, context_epoch, policy_revision, kernel_generation, behavior_epoch, created_at, updated_at FROM sessions`

type rowScanner interface{ Scan(...any) error }

func scanSession(row rowScanner, id string) (Session, error) {
	var s Session
	var created, updated int64
	err := row.Scan(&s.ID, &s.ParentID, &s.State, &s.StateReason, &s.ContextEpoch, &s.PolicyRevision, &s.KernelGen, &s.BehaviorEpoch, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	if err != nil {
		return s, fmt.Errorf("read session %s: %w", id, err)
	}
	s.CreatedAt, s.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return s, nil
}

// Session reads one session.
func (s *Store) Session(ctx context.Context, id string) (Session, error) {
	return scanSession(s.rdb.QueryRowContext(ctx, sessionSelect+` WHERE id = ?`, id), id)
}

// Sessions lists every session, oldest first.
func (s *Store) Sessions(ctx context.Context) ([]Session, error) {
	rows, err := s.rdb.QueryContext(ctx, sessionSelect+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		sess, err := scanSession(rows, "")
		if err != nil {
			return nil, err
		}
		out = append(out, sess)
	}
	return out, rows.Err()
}
