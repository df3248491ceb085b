package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Outbox effect kinds and states.
const (
	EffectSend  = "send"
	EffectReact = "react"

	EffectPending    = "pending"
	EffectAttempting = "attempting"
	EffectConfirmed  = "confirmed"
	EffectFailed     = "failed"
	EffectUnknown    = "unknown"
	// EffectHeld: delivery.review did not allow it; it waits for the
	// operator, who releases it (pending) or drops it (failed, "dropped").
	EffectHeld = "held"
)

// NewEffect is a send or reaction to put in the outbox.
type NewEffect struct {
	Session        string
	Kind           string // send or react
	ConversationID int64
	// IdempotencyKey identifies the request (the cell's execution and
	// request id): enqueueing it again returns the first effect.
	IdempotencyKey string
	Nonce          string // 1-25 characters, unique; the caller makes it outside the write
	Text           string // send
	Emoji          string // react
	// Target is the message a reaction goes on, or a send's explicit reply_to.
	Target string
	// ItemID is the attention item a send answers (0: none): its anchor is
	// reserved for this effect when free, and a confirmed send marks it acted.
	ItemID    int64
	Execution int64
	Frame     int64
	Epoch     int64
	// Held records the effect as held, with Reason: the review did not
	// allow it, so the transport never sees it unless the operator releases it.
	Held   bool
	Reason string
	// Files go with the send (artifacts copied from the cell's workspace).
	Files []EffectFile
}

// Effect is an outbox row as the transport and the cell see it.
type Effect struct {
	ID             int64      `json:"id"`
	Session        string     `json:"session"`
	Kind           string     `json:"kind"`
	State          string     `json:"state"`
	Conversation   string     `json:"conversation"` // alias
	ChannelID      string     `json:"channel_id"`
	Nonce          string     `json:"nonce"`
	Text           string     `json:"text,omitempty"`
	Emoji          string     `json:"emoji,omitempty"`
	Target         string     `json:"target_message_id,omitempty"`
	ReplyReference bool       `json:"reply_reference"`
	ItemID         int64      `json:"item_id,omitempty"`
	Attempts       int64      `json:"attempts"`
	MessageID      string     `json:"message_id,omitempty"`
	ErrorCode      string     `json:"error_code,omitempty"`
	Error          string     `json:"error,omitempty"`
	Evidence       string     `json:"evidence,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	ClaimedAt      *time.Time `json:"claimed_at,omitempty"`
	SettledAt      *time.Time `json:"settled_at,omitempty"`
	Repeat         bool       `json:"repeat,omitempty"` // the idempotency key was seen before
	// HeldReason is why delivery.review held it (kept after a release);
	// ReleasedBy names the operator who released or dropped it.
	HeldReason string `json:"held_reason,omitempty"`
	ReleasedBy string `json:"released_by,omitempty"`
}

const effectSelect = `SELECT o.id, o.session_id, o.kind, o.state, c.alias, c.channel_id, o.nonce, o.text, o.emoji, o.target_message_id,
	o.reply_reference, COALESCE(o.item_id, 0), o.attempts, o.message_id, o.error_code, o.error, o.evidence, o.created_at, o.claimed_at, o.settled_at,
	o.held_reason, o.released_by
	FROM discord_outbox o JOIN discord_conversations c ON c.id = o.conversation_id`

func scanEffect(row rowScanner) (Effect, error) {
	var e Effect
	var created int64
	var claimed, settled sql.NullInt64
	err := row.Scan(&e.ID, &e.Session, &e.Kind, &e.State, &e.Conversation, &e.ChannelID, &e.Nonce, &e.Text, &e.Emoji, &e.Target,
		&e.ReplyReference, &e.ItemID, &e.Attempts, &e.MessageID, &e.ErrorCode, &e.Error, &e.Evidence, &created, &claimed, &settled,
		&e.HeldReason, &e.ReleasedBy)
	e.CreatedAt = time.UnixMilli(created)
	if claimed.Valid {
		t := time.UnixMilli(claimed.Int64)
		e.ClaimedAt = &t
	}
	if settled.Valid {
		t := time.UnixMilli(settled.Int64)
		e.SettledAt = &t
	}
	return e, err
}

func (t *Tx) effect(id int64) (Effect, error) {
	e, err := scanEffect(t.queryRow(effectSelect+` WHERE o.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("%w: %d", ErrUnknownEffect, id)
	}
	if err != nil {
		return e, fmt.Errorf("outbox: %w", err)
	}
	return e, nil
}

// Effect reads one effect.
func (s *Store) Effect(ctx context.Context, id int64) (Effect, error) {
	e, err := scanEffect(s.rdb.QueryRowContext(ctx, effectSelect+` WHERE o.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("%w: %d", ErrUnknownEffect, id)
	}
	return e, err
}

// EnqueueEffect puts an effect in the outbox, or returns the effect already
// recorded under its idempotency key (Repeat set). A send that answers an
// attention item reserves the item's reply anchor when no other effect holds
// it and no confirmed send consumed it.
func (t *Tx) EnqueueEffect(n NewEffect) (Effect, error) {
	var id int64
	err := t.queryRow(`SELECT id FROM discord_outbox WHERE idempotency_key = ?`, n.IdempotencyKey).Scan(&id)
	if err == nil {
		e, err := t.effect(id)
		e.Repeat = true
		return e, err
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Effect{}, fmt.Errorf("outbox: %w", err)
	}
	target, reply := n.Target, n.Kind == EffectSend && n.Target != ""
	var reserve bool
	if n.ItemID != 0 {
		var conv int64
		var msg string
		var holder sql.NullInt64
		var consumed bool
		err := t.queryRow(`SELECT conversation_id, message_id, anchor_effect, anchor_consumed FROM attention_items WHERE id = ?`, n.ItemID).
			Scan(&conv, &msg, &holder, &consumed)
		if errors.Is(err, sql.ErrNoRows) {
			return Effect{}, fmt.Errorf("%w: %d", ErrUnknownItem, n.ItemID)
		}
		if err != nil {
			return Effect{}, fmt.Errorf("outbox: %w", err)
		}
		if conv != n.ConversationID {
			return Effect{}, fmt.Errorf("%w: item %d is not in this conversation", ErrItemElsewhere, n.ItemID)
		}
		if n.Kind == EffectSend && target == "" && !holder.Valid && !consumed && !n.Held {
			target, reserve = msg, true
		}
	}
	state, code, heldReason := EffectPending, "", ""
	if n.Held {
		state, code, heldReason = EffectHeld, "held", n.Reason
	}
	var item, exec, frame any
	if n.ItemID != 0 {
		item = n.ItemID
	}
	if n.Execution != 0 {
		exec = n.Execution
	}
	if n.Frame != 0 {
		frame = n.Frame
	}
	res, err := t.exec(`INSERT INTO discord_outbox (session_id, kind, conversation_id, idempotency_key, nonce, state, text, emoji,
		target_message_id, item_id, execution_id, frame_id, epoch, reply_reference, error_code, error, held_reason, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		n.Session, n.Kind, n.ConversationID, n.IdempotencyKey, n.Nonce, state, n.Text, n.Emoji, target, item, exec, frame, n.Epoch,
		reply, code, n.Reason, heldReason, t.now.UnixMilli())
	if err != nil {
		return Effect{}, fmt.Errorf("outbox: %w", err)
	}
	id, _ = res.LastInsertId()
	if err := t.addEffectFiles(id, n.Files); err != nil {
		return Effect{}, err
	}
	if reserve {
		if _, err := t.exec(`UPDATE attention_items SET anchor_effect = ? WHERE id = ?`, id, n.ItemID); err != nil {
			return Effect{}, fmt.Errorf("outbox: reserve anchor: %w", err)
		}
	}
	e, err := t.effect(id)
	if err != nil {
		return e, err
	}
	if n.Held {
		err = t.recordOutcome(e)
	}
	return e, err
}

// ClaimEffects moves up to limit pending effects, oldest first, to
// attempting and returns them. A send with an anchor gets a reply reference
// when the channel has advanced past its anchor (or reply_to was explicit).
func (t *Tx) ClaimEffects(limit int) ([]Effect, error) {
	rows, err := t.query(effectSelect+` WHERE o.state = 'pending' ORDER BY o.id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", err)
	}
	var out []Effect
	for rows.Next() {
		e, err := scanEffect(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim effects: %w", err)
		}
		out = append(out, e)
	}
	rows.Close()
	for i := range out {
		e := &out[i]
		if e.Kind == EffectSend && e.Target != "" && !e.ReplyReference {
			var last string
			if err := t.queryRow(`SELECT last_message_id FROM discord_conversations WHERE channel_id = ?`, e.ChannelID).Scan(&last); err != nil {
				return nil, fmt.Errorf("claim effects: %w", err)
			}
			e.ReplyReference = last != e.Target
		}
		if _, err := t.exec(`UPDATE discord_outbox SET state = 'attempting', attempts = attempts + 1, claimed_at = ?, reply_reference = ? WHERE id = ?`,
			t.now.UnixMilli(), e.ReplyReference, e.ID); err != nil {
			return nil, fmt.Errorf("claim effects: %w", err)
		}
		e.State, e.Attempts = EffectAttempting, e.Attempts+1
		now := t.now
		e.ClaimedAt = &now
	}
	return out, nil
}

// Attempting lists the effects left attempting (by a transport that died
// mid-attempt, or the one working now).
func (t *Tx) Attempting() ([]Effect, error) {
	rows, err := t.query(effectSelect + ` WHERE o.state = 'attempting' ORDER BY o.id`)
	if err != nil {
		return nil, fmt.Errorf("attempting effects: %w", err)
	}
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		e, err := scanEffect(rows)
		if err != nil {
			return nil, fmt.Errorf("attempting effects: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Outcome is a transport's report on an attempted effect.
type Outcome struct {
	State     string // confirmed, failed, unknown; pending = retry later (only when nothing can have been delivered)
	MessageID string // confirmed send: the Discord message id
	ErrorCode string
	Error     string
	Evidence  string // how a confirmed or unknown outcome was established (response, nonce in history, …)
	// AttachmentIDs are Discord's ids of a confirmed send's files, in the
	// order they were sent (from the message Discord answered with).
	AttachmentIDs []string
}

// SettleEffect records the outcome of an attempting effect (or evidence that
// settles an unknown one as confirmed). With a confirmed send it records, in
// the same transaction, the conversation's advance, the reply anchor's
// consumption and the answered item's move to acted (origin delivery). With
// failed or unknown it frees a reserved anchor. Reporting the state an
// effect already has is answered with the effect (Repeat set).
func (t *Tx) SettleEffect(id int64, o Outcome) (Effect, error) {
	e, err := t.effect(id)
	if err != nil {
		return e, err
	}
	if e.State == o.State && e.State != EffectAttempting && e.State != EffectPending {
		e.Repeat = true
		return e, nil
	}
	legal := (e.State == EffectAttempting && (o.State == EffectConfirmed || o.State == EffectFailed || o.State == EffectUnknown || o.State == EffectPending)) ||
		(e.State == EffectUnknown && o.State == EffectConfirmed)
	if !legal {
		return e, fmt.Errorf("%w: effect %d is %s, it cannot become %s", ErrOutboxMove, id, e.State, o.State)
	}
	if o.State == EffectConfirmed && e.Kind == EffectSend && o.MessageID == "" {
		return e, fmt.Errorf("%w: a confirmed send needs its message id", ErrOutboxMove)
	}
	var settled any
	if o.State != EffectPending {
		settled = t.now.UnixMilli()
	}
	if _, err := t.exec(`UPDATE discord_outbox SET state = ?, message_id = ?, error_code = ?, error = ?, evidence = ?, settled_at = ? WHERE id = ?`,
		o.State, o.MessageID, o.ErrorCode, o.Error, o.Evidence, settled, id); err != nil {
		return e, fmt.Errorf("settle effect %d: %w", id, err)
	}
	e.State, e.MessageID, e.ErrorCode, e.Error, e.Evidence = o.State, o.MessageID, o.ErrorCode, o.Error, o.Evidence
	switch o.State {
	case EffectPending:
		return e, nil
	case EffectConfirmed:
		if e.Kind == EffectSend {
			var conv int64
			if err := t.queryRow(`SELECT conversation_id FROM discord_outbox WHERE id = ?`, id).Scan(&conv); err != nil {
				return e, fmt.Errorf("settle effect %d: %w", id, err)
			}
			if err := t.advance(conv, o.MessageID, false, false); err != nil {
				return e, err
			}
			if err := t.setAttachmentIDs(id, o.AttachmentIDs); err != nil {
				return e, err
			}
			if _, err := t.exec(`UPDATE attention_items SET anchor_consumed = 1 WHERE anchor_effect = ?`, id); err != nil {
				return e, fmt.Errorf("settle effect %d: consume anchor: %w", id, err)
			}
			if e.ItemID != 0 {
				it, _, err := scanItem(t.queryRow(itemSelect+` WHERE a.id = ?`, e.ItemID))
				if err != nil {
					return e, fmt.Errorf("settle effect %d: item: %w", id, err)
				}
				if it.Status == ItemPending || it.Status == ItemSeen {
					if err := t.moveItem(it, ItemActed, OriginDelivery, "answered by a confirmed send", id); err != nil {
						return e, err
					}
				}
			}
		}
	default:
		if _, err := t.exec(`UPDATE attention_items SET anchor_effect = NULL WHERE anchor_effect = ? AND anchor_consumed = 0`, id); err != nil {
			return e, fmt.Errorf("settle effect %d: free anchor: %w", id, err)
		}
	}
	now := t.now
	e.SettledAt = &now
	if err := t.recordOutcome(e); err != nil {
		return e, err
	}
	if e.ReleasedBy != "" {
		// The operator released it long after the cell's receipt said held.
		return e, t.recordDecision(e, "release."+e.State)
	}
	return e, nil
}

// recordOutcome appends the settled effect to its session's speech lane:
// discord.sent, discord.failed or discord.unknown. Intention stays in the
// scratchpad; only this record says what was delivered.
func (t *Tx) recordOutcome(e Effect) error {
	kind := "discord." + map[string]string{EffectConfirmed: "sent", EffectFailed: "failed", EffectUnknown: "unknown", EffectHeld: "held"}[e.State]
	if e.Kind == EffectReact {
		kind = "discord.react." + e.State
	}
	rec := map[string]any{
		"effect_id": e.ID, "kind": e.Kind, "state": e.State, "conversation": e.Conversation, "channel_id": e.ChannelID,
		"text": e.Text, "emoji": e.Emoji, "target_message_id": e.Target, "reply_reference": e.ReplyReference,
		"item_id": e.ItemID, "message_id": e.MessageID, "error_code": e.ErrorCode, "error": e.Error, "evidence": e.Evidence,
		"held_reason": e.HeldReason, "released_by": e.ReleasedBy,
	}
	if e.Kind == EffectSend {
		// The files it carried: name, size and, once Discord confirmed them,
		// their attachment ids.
		files, err := t.effectFiles(e.ID)
		if err != nil {
			return err
		}
		if len(files) > 0 {
			list := make([]map[string]any, len(files))
			for i, f := range files {
				list[i] = map[string]any{"filename": f.Filename, "size": f.Size, "attachment_id": f.AttachmentID}
			}
			rec["files"] = list
		}
	}
	content, _ := json.Marshal(rec)
	_, _, err := t.appendItem(e.Session, kind, LaneSpeech, string(content), t.now, t.now)
	return err
}

// EffectCount is the number of effects of one kind in one state.
type EffectCount struct {
	Kind  string
	State string
	Count int64
}

// EffectCounts counts outbox effects by kind and state (for metrics).
func (s *Store) EffectCounts(ctx context.Context) ([]EffectCount, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT kind, state, count(*) FROM discord_outbox GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return nil, fmt.Errorf("effect counts: %w", err)
	}
	defer rows.Close()
	var out []EffectCount
	for rows.Next() {
		var c EffectCount
		if err := rows.Scan(&c.Kind, &c.State, &c.Count); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
