package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// MaxHeldPage bounds one listing of held effects.
const MaxHeldPage = 500

// HeldEffects lists the effects delivery.review held that wait for the
// operator, oldest first.
func (s *Store) HeldEffects(ctx context.Context, limit int) ([]Effect, error) {
	if limit < 1 || limit > MaxHeldPage {
		limit = MaxHeldPage
	}
	rows, err := s.rdb.QueryContext(ctx, effectSelect+` WHERE o.state = 'held' ORDER BY o.id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("held effects: %w", err)
	}
	defer rows.Close()
	out := []Effect{}
	for rows.Next() {
		e, err := scanEffect(rows)
		if err != nil {
			return nil, fmt.Errorf("held effects: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// HeldCount is how many effects wait for the operator.
func (s *Store) HeldCount(ctx context.Context) (int64, error) {
	var n int64
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM discord_outbox WHERE state = 'held'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("held count: %w", err)
	}
	return n, nil
}

// HeldOldest is when the oldest effect still waiting for the operator was
// held; ok is false when none waits.
func (s *Store) HeldOldest(ctx context.Context) (at time.Time, ok bool, err error) {
	var ms sql.NullInt64
	if err := s.rdb.QueryRowContext(ctx, `SELECT min(created_at) FROM discord_outbox WHERE state = 'held'`).Scan(&ms); err != nil {
		return time.Time{}, false, fmt.Errorf("held oldest: %w", err)
	}
	if !ms.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(ms.Int64), true, nil
}

// HeldDecisions counts the held effects the operator released and dropped.
func (s *Store) HeldDecisions(ctx context.Context) (released, dropped int64, err error) {
	err = s.rdb.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE error_code <> 'dropped'), count(*) FILTER (WHERE error_code = 'dropped')
		FROM discord_outbox WHERE released_by <> ''`).Scan(&released, &dropped)
	if err != nil {
		return 0, 0, fmt.Errorf("held decisions: %w", err)
	}
	return released, dropped, nil
}

// ReleaseEffect lets a held effect go out: it becomes pending, and the
// transport claims and performs it like any other, with the nonce it was
// made with (so it is sent at most once, and its receipt is as honest as any
// other's). by names who released it, for the receipt. A send that answers an
// item takes the item's reply anchor if it is still free. Releasing anything
// but a held effect is ErrOutboxMove: a second release does nothing.
func (t *Tx) ReleaseEffect(id int64, by string) (Effect, error) {
	e, err := t.heldEffect(id, "released")
	if err != nil {
		return e, err
	}
	target := e.Target
	if e.Kind == EffectSend && e.ItemID != 0 && target == "" {
		var msg string
		var holder, consumed bool
		if err := t.queryRow(`SELECT message_id, anchor_effect IS NOT NULL, anchor_consumed FROM attention_items WHERE id = ?`, e.ItemID).
			Scan(&msg, &holder, &consumed); err != nil {
			return e, fmt.Errorf("release effect %d: item: %w", id, err)
		}
		if !holder && !consumed {
			if _, err := t.exec(`UPDATE attention_items SET anchor_effect = ? WHERE id = ?`, id, e.ItemID); err != nil {
				return e, fmt.Errorf("release effect %d: reserve anchor: %w", id, err)
			}
			target = msg
		}
	}
	if _, err := t.exec(`UPDATE discord_outbox SET state = 'pending', error_code = '', error = '', released_by = ?, target_message_id = ? WHERE id = ?`,
		by, target, id); err != nil {
		return e, fmt.Errorf("release effect %d: %w", id, err)
	}
	if e, err = t.effect(id); err != nil {
		return e, err
	}
	return e, t.recordDecision(e, "released")
}

// DropEffect refuses a held effect for good: it becomes failed with error
// code "dropped", naming who dropped it. Dropping anything but a held effect
// is ErrOutboxMove.
func (t *Tx) DropEffect(id int64, by string) (Effect, error) {
	e, err := t.heldEffect(id, "dropped")
	if err != nil {
		return e, err
	}
	if _, err := t.exec(`UPDATE discord_outbox SET state = 'failed', error_code = 'dropped', error = ?, released_by = ?, settled_at = ? WHERE id = ?`,
		"held by delivery.review and dropped by "+by, by, t.now.UnixMilli(), id); err != nil {
		return e, fmt.Errorf("drop effect %d: %w", id, err)
	}
	if e, err = t.effect(id); err != nil {
		return e, err
	}
	if err := t.recordDecision(e, "dropped"); err != nil {
		return e, err
	}
	return e, t.recordOutcome(e)
}

func (t *Tx) heldEffect(id int64, verb string) (Effect, error) {
	e, err := t.effect(id)
	if err != nil {
		return e, err
	}
	if e.State != EffectHeld {
		return e, fmt.Errorf("%w: effect %d is %s, not held: it cannot be %s", ErrOutboxMove, id, e.State, verb)
	}
	return e, nil
}

// recordDecision appends the operator's decision on a held effect to its
// session's notice lane, model-visible (discord.released, discord.dropped):
// the model learns of it with its next turn; a released effect's outcome
// follows as discord.release.<state>.
func (t *Tx) recordDecision(e Effect, kind string) error {
	_, err := t.Notice(e.Session, "discord."+kind, map[string]any{
		"effect_id": e.ID, "kind": e.Kind, "state": e.State, "conversation": e.Conversation, "text": clipText(e.Text, 400), "emoji": e.Emoji,
		"message_id": e.MessageID, "error": e.Error, "held_reason": e.HeldReason, "released_by": e.ReleasedBy,
	}, true)
	return err
}

func clipText(s string, n int) string {
	for i := range s {
		if i >= n {
			return s[:i] + "…"
		}
	}
	return s
}

// DecideHeld releases (release true) or drops held effect id in the name
// of by, in one transaction: the operator API, the browser and a Discord
// button all decide through it.
func (s *Store) DecideHeld(ctx context.Context, id int64, release bool, by string) (Effect, error) {
	var e Effect
	err := s.Write(ctx, func(tx *Tx) (err error) {
		if release {
			e, err = tx.ReleaseEffect(id, by)
		} else {
			e, err = tx.DropEffect(id, by)
		}
		return err
	})
	return e, err
}
