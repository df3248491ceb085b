package store

import (
	"fmt"
)

// ToolState is how a tool call was answered.
type ToolState string

// Tool call states: pending until answered, then done (a cell ran and its
// outcome answers), invalid (arguments the host could not run), interrupted
// (the cell or the step was cut off) or skipped (an earlier call of the group
// waited, so this one never ran).
const (
	ToolPending     ToolState = "pending"
	ToolDone        ToolState = "done"
	ToolInvalid     ToolState = "invalid"
	ToolInterrupted ToolState = "interrupted"
	ToolSkipped     ToolState = "skipped"
)

// AnswerToolCall answers a pending tool call with the record eventID and
// appends it to the session's current context as the call's result.
func (t *Tx) AnswerToolCall(session string, step int64, callID string, state ToolState, eventID int64) error {
	res, err := t.exec(`UPDATE tool_calls SET state = ?, result_event_id = ? WHERE step_id = ? AND call_id = ? AND session_id = ? AND state = 'pending'`,
		state, eventID, step, callID, session)
	if err != nil {
		return fmt.Errorf("answer tool call %s: %w", callID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("answer tool call %s of step %d: not pending", callID, step)
	}
	return t.addContext(session, "tool", eventID, callID)
}

// addContext appends an event to the session's current context epoch.
func (t *Tx) addContext(session, role string, eventID int64, callID string) error {
	var call any
	if callID != "" {
		call = callID
	}
	_, err := t.exec(`INSERT INTO context_items (session_id, context_epoch, role, event_id, call_id)
		SELECT id, context_epoch, ?, ?, ? FROM sessions WHERE id = ?`, role, eventID, call, session)
	if err != nil {
		return fmt.Errorf("context item: %w", err)
	}
	return nil
}
