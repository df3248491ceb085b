package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// InboxState is an input's scheduling state.
type InboxState string

// Inbox states: pending → claimed → consumed | cancelled (claimed may also go
// back to pending when an attempt is abandoned before its frame committed).
const (
	InboxPending   InboxState = "pending"
	InboxClaimed   InboxState = "claimed"
	InboxConsumed  InboxState = "consumed"
	InboxCancelled InboxState = "cancelled"
)

// ErrInboxState reports an inbox move that the current state does not allow.
var ErrInboxState = errors.New("illegal inbox transition")

// InboxItem is one input as the scheduler sees it.
type InboxItem struct {
	InputID      int64      `json:"input_id"`
	Session      string     `json:"session"`
	State        InboxState `json:"state"`
	SourceKind   string     `json:"source_kind"`
	Conversation string     `json:"conversation"`
	ReceivedAt   time.Time  `json:"received_at"`
	FrameID      int64      `json:"frame_id,omitempty"`
}

// ClaimPending moves up to limit pending inputs of session, oldest first, to
// claimed and returns them. Claiming is not completion: the inputs are
// acknowledged only by CommitFrame.
func (t *Tx) ClaimPending(session string, limit int) ([]InboxItem, error) {
	rows, err := t.query(`
		SELECT b.input_id, i.source_kind, i.conversation, i.received_at
		FROM inbox b JOIN inputs i ON i.id = b.input_id
		WHERE b.session_id = ? AND b.state = 'pending' ORDER BY b.input_id LIMIT ?`, session, limit)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var items []InboxItem
	for rows.Next() {
		it := InboxItem{Session: session, State: InboxClaimed}
		var rec int64
		if err := rows.Scan(&it.InputID, &it.SourceKind, &it.Conversation, &rec); err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim: %w", err)
		}
		it.ReceivedAt = time.UnixMilli(rec)
		items = append(items, it)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	for _, it := range items {
		if err := t.moveInbox(it.InputID, InboxPending, InboxClaimed, nil); err != nil {
			return nil, err
		}
	}
	return items, nil
}

// moveInbox is the one place an inbox row changes state, compare-and-swap on from.
func (t *Tx) moveInbox(inputID int64, from, to InboxState, frame any) error {
	res, err := t.exec(`UPDATE inbox SET state = ?, frame_id = ?, updated_at = ? WHERE input_id = ? AND state = ?`,
		to, frame, t.now.UnixMilli(), inputID, from)
	if err != nil {
		if strings.Contains(err.Error(), "illegal inbox transition") {
			return fmt.Errorf("%w: input %d from %s to %s", ErrInboxState, inputID, from, to)
		}
		return fmt.Errorf("inbox: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var cur InboxState
		if err := t.queryRow(`SELECT state FROM inbox WHERE input_id = ?`, inputID).Scan(&cur); err != nil {
			return fmt.Errorf("%w: input %d not found", ErrInboxState, inputID)
		}
		return fmt.Errorf("%w: input %d is %s, not %s", ErrInboxState, inputID, cur, from)
	}
	return nil
}

// ReleaseClaims returns claimed inputs to pending (an attempt abandoned
// before its frame was frozen).
func (t *Tx) ReleaseClaims(inputIDs []int64) error {
	for _, id := range inputIDs {
		if err := t.moveInbox(id, InboxClaimed, InboxPending, nil); err != nil {
			return err
		}
	}
	return nil
}

// RecoverClaims returns every claimed input to pending. The owner calls it at
// start, when no attempt can be alive, so claims of a dead process are not lost.
func (t *Tx) RecoverClaims() (int64, error) {
	res, err := t.exec(`UPDATE inbox SET state = 'pending', updated_at = ? WHERE state = 'claimed'`, t.now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("recover claims: %w", err)
	}
	return res.RowsAffected()
}

// CancelInput cancels a pending or claimed input.
func (t *Tx) CancelInput(inputID int64) error {
	var cur InboxState
	if err := t.queryRow(`SELECT state FROM inbox WHERE input_id = ?`, inputID).Scan(&cur); err != nil {
		return fmt.Errorf("%w: input %d not found", ErrInboxState, inputID)
	}
	return t.moveInbox(inputID, cur, InboxCancelled, nil)
}

// Frame is the immutable record of what one model request consumed.
type Frame struct {
	Session        string
	InputIDs       []int64
	ContextEpoch   int64
	PolicyRevision string
	RoutingHandles json.RawMessage // nil means {}
}

// CommitFrame freezes an attention frame and, in the same transaction,
// acknowledges its inputs: each must be claimed by this session, and becomes
// consumed with a reference to the frame.
func (t *Tx) CommitFrame(f Frame) (int64, error) {
	if len(f.InputIDs) == 0 {
		return 0, errors.New("commit frame: no inputs")
	}
	routing := f.RoutingHandles
	if routing == nil {
		routing = json.RawMessage("{}")
	}
	res, err := t.exec(`INSERT INTO attention_frames (session_id, context_epoch, policy_revision, routing_handles, created_at)
		VALUES (?, ?, ?, ?, ?)`, f.Session, f.ContextEpoch, f.PolicyRevision, string(routing), t.now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("commit frame: %w", err)
	}
	frameID, _ := res.LastInsertId()
	for _, id := range f.InputIDs {
		var owner string
		if err := t.queryRow(`SELECT session_id FROM inbox WHERE input_id = ?`, id).Scan(&owner); err != nil {
			return 0, fmt.Errorf("%w: input %d not found", ErrInboxState, id)
		}
		if owner != f.Session {
			return 0, fmt.Errorf("%w: input %d belongs to session %s", ErrInboxState, id, owner)
		}
		if err := t.moveInbox(id, InboxClaimed, InboxConsumed, frameID); err != nil {
			return 0, err
		}
	}
	return frameID, nil
}

// Inbox lists the inbox rows of session in input order.
func (s *Store) Inbox(ctx context.Context, session string) ([]InboxItem, error) {
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT b.input_id, b.session_id, b.state, i.source_kind, i.conversation, i.received_at, COALESCE(b.frame_id, 0)
		FROM inbox b JOIN inputs i ON i.id = b.input_id
		WHERE b.session_id = ? ORDER BY b.input_id`, session)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	defer rows.Close()
	var out []InboxItem
	for rows.Next() {
		var it InboxItem
		var rec int64
		if err := rows.Scan(&it.InputID, &it.Session, &it.State, &it.SourceKind, &it.Conversation, &rec, &it.FrameID); err != nil {
			return nil, fmt.Errorf("inbox: %w", err)
		}
		it.ReceivedAt = time.UnixMilli(rec)
		out = append(out, it)
	}
	return out, rows.Err()
}
