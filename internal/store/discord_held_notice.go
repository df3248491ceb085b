package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Held sends the operator is told of: with [discord] operator_user_id and
// notify_held, klbr-discord DMs the operator once per held effect and
// reports the outcome; an effect with an outcome is never handed out again.

// MaxHeldNotices bounds the held effects handed out for notices at once.
const MaxHeldNotices = 16

// HeldNotice is the outcome of one notice.
type HeldNotice struct {
	EffectID  int64  `json:"effect_id"`
	State     string `json:"state"` // sent or failed
	MessageID string `json:"message_id,omitempty"`
	Error     string `json:"error,omitempty"`
}

// ErrNoticeState is a notice outcome that is neither sent nor failed.
var ErrNoticeState = errors.New("a notice is sent (with its message id) or failed (with an error)")

// HeldToNotify lists held effects no notice was sent for, oldest first (at
// most limit, at most MaxHeldNotices).
func (s *Store) HeldToNotify(ctx context.Context, limit int) ([]Effect, error) {
	if limit < 1 || limit > MaxHeldNotices {
		limit = MaxHeldNotices
	}
	rows, err := s.rdb.QueryContext(ctx, effectSelect+` WHERE o.state = 'held'
		AND NOT EXISTS (SELECT 1 FROM discord_held_notices n WHERE n.effect_id = o.id) ORDER BY o.id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("held to notify: %w", err)
	}
	defer rows.Close()
	out := []Effect{}
	for rows.Next() {
		e, err := scanEffect(rows)
		if err != nil {
			return nil, fmt.Errorf("held to notify: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RecordHeldNotice records a notice's outcome; the first one stands (a
// transport that died after sending may notify twice; its nonce makes
// Discord answer the repeat with the same message).
func (t *Tx) RecordHeldNotice(n HeldNotice) error {
	if n.State != "sent" && n.State != "failed" || n.State == "sent" && n.MessageID == "" || len(n.MessageID) > 32 || len(n.Error) > 2048 {
		return ErrNoticeState
	}
	if _, err := t.effect(n.EffectID); err != nil {
		return err
	}
	if _, err := t.exec(`INSERT INTO discord_held_notices (effect_id, state, message_id, error, at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (effect_id) DO NOTHING`, n.EffectID, n.State, n.MessageID, n.Error, t.now.UnixMilli()); err != nil {
		return fmt.Errorf("record held notice %d: %w", n.EffectID, err)
	}
	return nil
}

// HeldNoticeOf returns effect id's notice outcome; ok is false when none was
// recorded.
func (s *Store) HeldNoticeOf(ctx context.Context, id int64) (n HeldNotice, ok bool, err error) {
	err = s.rdb.QueryRowContext(ctx, `SELECT effect_id, state, message_id, error FROM discord_held_notices WHERE effect_id = ?`, id).
		Scan(&n.EffectID, &n.State, &n.MessageID, &n.Error)
	if errors.Is(err, sql.ErrNoRows) {
		return n, false, nil
	}
	if err != nil {
		return n, false, fmt.Errorf("held notice %d: %w", id, err)
	}
	return n, true, nil
}
