package store

import "encoding/json"

// HoldToolCall answers a pending call whose cell execution.review held: it
// never ran. The answer is a tool.unrun record whose state is "held", with
// the reason the model sees (the call itself is closed as skipped).
func (t *Tx) HoldToolCall(session string, step int64, callID, reason string) error {
	b, _ := json.Marshal(map[string]any{"tool_call_id": callID, "step_id": step, "state": "held", "message": reason})
	eventID, _, err := t.appendItem(session, "tool.unrun", LaneCell, string(b), t.now, t.now)
	if err != nil {
		return err
	}
	return t.AnswerToolCall(session, step, callID, ToolSkipped, eventID)
}
