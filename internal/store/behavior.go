package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrStaleEpoch reports an activation whose parent epoch is no longer current.
var ErrStaleEpoch = errors.New("stale behavior epoch")

// Activation is one entry of a session's behavior history.
type Activation struct {
	Session     string    `json:"session"`
	Epoch       int64     `json:"epoch"`
	Release     string    `json:"release"`
	Kind        string    `json:"kind"`
	Reason      string    `json:"reason"`
	ActivatedAt time.Time `json:"activated_at"`
}

// RecordRelease stores a published release's manifest (idempotent).
func (t *Tx) RecordRelease(id string, manifest json.RawMessage) error {
	_, err := t.exec(`INSERT INTO behavior_releases (id, manifest, published_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		id, string(manifest), t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("record release: %w", err)
	}
	return nil
}

// Activate makes release the session's behavior at epoch parent+1, if the
// session is still at parent (compare-and-swap), and records a notice.
func (t *Tx) Activate(session string, parent int64, release, kind, reason string) (int64, error) {
	res, err := t.exec(`UPDATE sessions SET behavior_epoch = behavior_epoch + 1, policy_revision = ?, updated_at = ?
		WHERE id = ? AND behavior_epoch = ?`, release, t.now.UnixMilli(), session, parent)
	if err != nil {
		return 0, fmt.Errorf("activate: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var cur int64
		if err := t.queryRow(`SELECT behavior_epoch FROM sessions WHERE id = ?`, session).Scan(&cur); err != nil {
			return 0, fmt.Errorf("%w: %s", ErrUnknownSession, session)
		}
		return 0, fmt.Errorf("%w: %s is at epoch %d, not %d; look at `klbr-core releases` and activate against the current epoch", ErrStaleEpoch, session, cur, parent)
	}
	epoch := parent + 1
	if _, err := t.exec(`INSERT INTO activations (session_id, epoch, release_id, kind, reason, activated_at) VALUES (?, ?, ?, ?, ?, ?)`,
		session, epoch, release, kind, reason, t.now.UnixMilli()); err != nil {
		return 0, fmt.Errorf("activate: %w", err)
	}
	return epoch, t.notice(session, "revision.activated", map[string]any{
		"epoch": epoch, "release": release, "kind": kind, "reason": reason,
	})
}

// Activations lists a session's activations, newest first.
func (s *Store) Activations(ctx context.Context, session string) ([]Activation, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT session_id, epoch, release_id, kind, reason, activated_at
		FROM activations WHERE session_id = ? ORDER BY epoch DESC`, session)
	if err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	defer rows.Close()
	var out []Activation
	for rows.Next() {
		var a Activation
		var at int64
		if err := rows.Scan(&a.Session, &a.Epoch, &a.Release, &a.Kind, &a.Reason, &at); err != nil {
			return nil, err
		}
		a.ActivatedAt = time.UnixMilli(at)
		out = append(out, a)
	}
	return out, rows.Err()
}

// ReleaseManifest returns a recorded release's manifest.
func (s *Store) ReleaseManifest(ctx context.Context, id string) (json.RawMessage, error) {
	var m string
	err := s.rdb.QueryRowContext(ctx, `SELECT manifest FROM behavior_releases WHERE id = ?`, id).Scan(&m)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("release %s is not recorded", id)
	}
	return json.RawMessage(m), err
}

// ReleaseIDs lists recorded releases, newest first.
func (s *Store) ReleaseIDs(ctx context.Context) ([]string, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id FROM behavior_releases ORDER BY published_at DESC, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		out = append(out, id)
	}
	return out, rows.Err()
}

// HookInvocation is the record of one policy hook call.
type HookInvocation struct {
	Session     string
	Slot        string
	Release     string
	Epoch       int64
	InputDigest string
	Outcome     string // ok, error, invalid, timeout, unavailable
	Fallback    bool
	Result      json.RawMessage
	Error       string
	Latency     time.Duration
	// Input, when set and within MaxHookInput, is kept (by InputDigest)
	// for replay against a candidate release.
	Input json.RawMessage
}

// RecordHookInvocation stores one invocation.
func (t *Tx) RecordHookInvocation(h HookInvocation) error {
	var result any
	if len(h.Result) > 0 {
		result = string(h.Result)
	}
	_, err := t.exec(`INSERT INTO hook_invocations (session_id, slot, release_id, epoch, input_digest, outcome, fallback, result, error, latency_us, at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		h.Session, h.Slot, h.Release, h.Epoch, h.InputDigest, h.Outcome, h.Fallback, result, h.Error, h.Latency.Microseconds(), t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("record hook invocation: %w", err)
	}
	return t.storeHookInput(h.Slot, h.InputDigest, h.Input)
}

// HeldCount counts held reviews of one session.
type HeldCount struct {
	Session  string
	Fallback bool
	Count    int64
}

// HeldReviews counts delivery.review invocations that held, per session and
// by whether the hook decided (fallback false) or the host held for it.
func (s *Store) HeldReviews(ctx context.Context) ([]HeldCount, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT session_id, fallback, count(*) FROM hook_invocations
		WHERE slot = 'delivery.review' AND (fallback = 1 OR json_extract(result, '$.decision') = 'hold')
		GROUP BY session_id, fallback`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []HeldCount
	for rows.Next() {
		var h HeldCount
		if err := rows.Scan(&h.Session, &h.Fallback, &h.Count); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// HookInvocationRecord is a stored invocation, for tests and tools.
type HookInvocationRecord struct {
	Slot     string `json:"slot"`
	Outcome  string `json:"outcome"`
	Fallback bool   `json:"fallback"`
	Epoch    int64  `json:"epoch"`
	Error    string `json:"error"`
}

// HookInvocations lists a session's recorded invocations, oldest first.
func (s *Store) HookInvocations(ctx context.Context, session string) ([]HookInvocationRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT slot, outcome, fallback, epoch, error FROM hook_invocations WHERE session_id = ? ORDER BY id`, session)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []HookInvocationRecord
	for rows.Next() {
		var h HookInvocationRecord
		if err := rows.Scan(&h.Slot, &h.Outcome, &h.Fallback, &h.Epoch, &h.Error); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}
