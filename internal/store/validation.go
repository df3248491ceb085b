package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// MaxHookInput bounds a stored hook invocation input: a larger one is
// recorded by digest only, and is not replayed.
const MaxHookInput = 64 << 10

// storeHookInput keeps an invocation's input for replay, once per digest,
// marking it used now.
func (t *Tx) storeHookInput(slot, digest string, input json.RawMessage) error {
	if len(input) == 0 || len(input) > MaxHookInput || !json.Valid(input) {
		return nil
	}
	_, err := t.exec(`INSERT INTO hook_inputs (digest, slot, input, bytes, at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET at = excluded.at`,
		digest, slot, string(input), len(input), t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("store hook input: %w", err)
	}
	return nil
}

// PruneHookInputs drops, for each of slots, the stored inputs that none of
// the slot's newest keep invocations in any session used (bounded index
// look-ups), and returns how many went.
func (t *Tx) PruneHookInputs(slots []string, keep int) (int64, error) {
	rows, err := t.query(`SELECT id FROM sessions`)
	if err != nil {
		return 0, fmt.Errorf("prune hook inputs: %w", err)
	}
	var sessions []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		sessions = append(sessions, id)
	}
	rows.Close()
	var n int64
	for _, slot := range slots {
		cutoff := int64(-1) // the oldest use any session's newest keep still need
		for _, s := range sessions {
			var at int64
			err := t.queryRow(`SELECT at FROM hook_invocations WHERE session_id = ? AND slot = ? ORDER BY id DESC LIMIT 1 OFFSET ?`,
				s, slot, keep-1).Scan(&at)
			if errors.Is(err, sql.ErrNoRows) {
				// Fewer than keep: all of them count; its oldest bounds the cut.
				err = t.queryRow(`SELECT at FROM hook_invocations WHERE session_id = ? AND slot = ? ORDER BY id LIMIT 1`, s, slot).Scan(&at)
				if errors.Is(err, sql.ErrNoRows) {
					continue
				}
			}
			if err != nil {
				return n, fmt.Errorf("prune hook inputs: %w", err)
			}
			if cutoff < 0 || at < cutoff {
				cutoff = at
			}
		}
		if cutoff < 0 {
			continue
		}
		res, err := t.exec(`DELETE FROM hook_inputs WHERE slot = ? AND at < ?`, slot, cutoff)
		if err != nil {
			return n, fmt.Errorf("prune hook inputs: %w", err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	return n, nil
}

// Replayable is a recorded invocation whose input is kept.
type Replayable struct {
	ID      int64           `json:"id"`
	Slot    string          `json:"slot"`
	Release string          `json:"release"`
	Epoch   int64           `json:"epoch"`
	At      time.Time       `json:"at"`
	Input   json.RawMessage `json:"input"`
	Result  json.RawMessage `json:"result"`
}

// ReplayableInvocations returns the newest n invocations of slot in session
// that answered (outcome ok, no fallback) and whose input is kept, newest first.
func (s *Store) ReplayableInvocations(ctx context.Context, session, slot string, n int) ([]Replayable, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT h.id, h.slot, h.release_id, h.epoch, h.at, i.input, h.result
		FROM hook_invocations h JOIN hook_inputs i ON i.digest = h.input_digest
		WHERE h.session_id = ? AND h.slot = ? AND h.outcome = 'ok' AND h.fallback = 0 AND h.result IS NOT NULL
		ORDER BY h.id DESC LIMIT ?`, session, slot, n)
	if err != nil {
		return nil, fmt.Errorf("replayable invocations: %w", err)
	}
	defer rows.Close()
	var out []Replayable
	for rows.Next() {
		var r Replayable
		var at int64
		var in, res string
		if err := rows.Scan(&r.ID, &r.Slot, &r.Release, &r.Epoch, &at, &in, &res); err != nil {
			return nil, err
		}
		r.At, r.Input, r.Result = time.UnixMilli(at), json.RawMessage(in), json.RawMessage(res)
		out = append(out, r)
	}
	return out, rows.Err()
}

// TraceEntry is one invocation as hooks.trace shows it.
type TraceEntry struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Slot      string          `json:"slot"`
	Release   string          `json:"release"`
	Epoch     int64           `json:"epoch"`
	Outcome   string          `json:"outcome"`
	Fallback  bool            `json:"fallback"`
	LatencyMS float64         `json:"latency_ms"`
	Error     string          `json:"error"`
	InputRef  string          `json:"input_ref"`        // the input's digest: hooks.trace's handle on it
	InputKept bool            `json:"input_kept"`       // whether the input itself is stored (bounded)
	Result    json.RawMessage `json:"result,omitempty"` // what the hook answered
	Input     json.RawMessage `json:"input,omitempty"`  // with inputs only
}

// HookTrace returns session's newest limit invocations, newest first; with
// inputs, each carries its stored input too.
func (s *Store) HookTrace(ctx context.Context, session string, limit int, inputs bool) ([]TraceEntry, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT h.id, h.at, h.slot, h.release_id, h.epoch, h.outcome, h.fallback, h.latency_us,
			h.error, h.input_digest, h.result, i.input
		FROM hook_invocations h LEFT JOIN hook_inputs i ON i.digest = h.input_digest
		WHERE h.session_id = ? ORDER BY h.id DESC LIMIT ?`, session, limit)
	if err != nil {
		return nil, fmt.Errorf("hook trace: %w", err)
	}
	defer rows.Close()
	var out []TraceEntry
	for rows.Next() {
		var e TraceEntry
		var at, lat int64
		var res, in sql.NullString
		if err := rows.Scan(&e.ID, &at, &e.Slot, &e.Release, &e.Epoch, &e.Outcome, &e.Fallback, &lat, &e.Error, &e.InputRef, &res, &in); err != nil {
			return nil, err
		}
		e.At, e.LatencyMS = time.UnixMilli(at), float64(lat)/1000
		if res.Valid {
			e.Result = json.RawMessage(res.String)
		}
		e.InputKept = in.Valid
		if inputs && in.Valid {
			e.Input = json.RawMessage(in.String)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RecordValidation stores the host's validation report of release for session.
func (t *Tx) RecordValidation(session, release string, ok bool, report json.RawMessage) error {
	_, err := t.exec(`INSERT INTO release_validations (session_id, release_id, ok, report, validated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (session_id, release_id) DO UPDATE SET ok = excluded.ok, report = excluded.report, validated_at = excluded.validated_at`,
		session, release, ok, string(report), t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("record validation: %w", err)
	}
	return nil
}

// Validation is a stored validation report.
type Validation struct {
	Session     string          `json:"session"`
	Release     string          `json:"release"`
	OK          bool            `json:"ok"`
	Report      json.RawMessage `json:"report"`
	ValidatedAt time.Time       `json:"validated_at"`
}

// ErrNoValidation reports a release never validated for a session.
var ErrNoValidation = errors.New("no validation report")

// ReleaseValidation returns the newest report of release: for session, or
// for any session when session is "".
func (s *Store) ReleaseValidation(ctx context.Context, session, release string) (Validation, error) {
	v := Validation{Release: release}
	var at int64
	var rep string
	err := s.rdb.QueryRowContext(ctx, `SELECT session_id, ok, report, validated_at FROM release_validations
		WHERE release_id = ? AND (? = '' OR session_id = ?) ORDER BY validated_at DESC LIMIT 1`, release, session, session).
		Scan(&v.Session, &v.OK, &rep, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%w for release %s", ErrNoValidation, release)
	}
	if err != nil {
		return v, fmt.Errorf("release validation: %w", err)
	}
	v.Report, v.ValidatedAt = json.RawMessage(rep), time.UnixMilli(at)
	return v, nil
}

// RecordWorkerCrash stores that a worker of session's epoch died unasked.
func (t *Tx) RecordWorkerCrash(session string, epoch int64, release, role, reason string) error {
	_, err := t.exec(`INSERT INTO worker_crashes (session_id, epoch, release_id, role, reason, at) VALUES (?, ?, ?, ?, ?, ?)`,
		session, epoch, release, role, reason, t.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("record worker crash: %w", err)
	}
	return nil
}

// WorkerCrashes counts the crashes of session's epoch since since.
func (s *Store) WorkerCrashes(ctx context.Context, session string, epoch int64, since time.Time) (int, error) {
	var n int
	err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM worker_crashes WHERE session_id = ? AND epoch = ? AND at >= ?`,
		session, epoch, since.UnixMilli()).Scan(&n)
	return n, err
}
