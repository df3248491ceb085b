package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// LocalSend is an explicit send to the operator's lane, reviewed already.
type LocalSend struct {
	Session   string
	Execution int64
	Request   int64
	Text      string
	Status    string // confirmed or held
	Reason    string
	Epoch     int64
	Release   string
	Fallback  bool // the host held it because the review did not decide
}

// Receipt is what the sender is told.
type Receipt struct {
	Status  string `json:"status"` // confirmed: durably published to the operator lane; held: not delivered
	Reason  string `json:"reason"`
	EventID int64  `json:"event_id"`
	Seq     int64  `json:"seq,omitempty"`
	Epoch   int64  `json:"epoch"`
	Repeat  bool   `json:"repeat,omitempty"` // the same request was answered before
}

// RecordLocalSend publishes a confirmed send to the speech lane (or records a
// held one there, saying why) and its receipt, in one transaction; a request
// already answered returns its first receipt.
func (t *Tx) RecordLocalSend(s LocalSend) (Receipt, error) {
	var r Receipt
	err := t.queryRow(`SELECT status, reason, event_id, epoch FROM local_deliveries WHERE execution_id = ? AND request_id = ?`,
		s.Execution, s.Request).Scan(&r.Status, &r.Reason, &r.EventID, &r.Epoch)
	if err == nil {
		r.Repeat = true
		return r, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("local send: %w", err)
	}
	content, _ := json.Marshal(map[string]any{
		"text": s.Text, "status": s.Status, "reason": s.Reason, "execution_id": s.Execution,
		"behavior_epoch": s.Epoch, "release": s.Release, "fallback": s.Fallback,
	})
	kind := "local.sent"
	if s.Status == "held" {
		kind = "local.held"
	}
	r.EventID, r.Seq, err = t.appendItem(s.Session, kind, LaneSpeech, string(content), t.now, t.now)
	if err != nil {
		return r, fmt.Errorf("local send: %w", err)
	}
	if _, err := t.exec(`INSERT INTO local_deliveries (session_id, execution_id, request_id, event_id, status, reason, epoch, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, s.Session, s.Execution, s.Request, r.EventID, s.Status, s.Reason, s.Epoch, t.now.UnixMilli()); err != nil {
		return r, fmt.Errorf("local send: %w", err)
	}
	r.Status, r.Reason, r.Epoch = s.Status, s.Reason, s.Epoch
	return r, nil
}
