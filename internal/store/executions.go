package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrExecutionFinished reports a second finish of one execution.
var ErrExecutionFinished = errors.New("execution already finished")

// ExecutionStates are the final states of a cell.
var ExecutionStates = []string{"ok", "error", "cancelled", "yielded", "lost"}

// NextKernelGeneration bumps and returns session's workbench generation and
// records a kernel.started notice with details (pid, python, placement…).
func (t *Tx) NextKernelGeneration(session string, details map[string]any) (int64, error) {
	if _, err := t.exec(`UPDATE sessions SET kernel_generation = kernel_generation + 1, updated_at = ? WHERE id = ?`, t.now.UnixMilli(), session); err != nil {
		return 0, fmt.Errorf("next kernel generation: %w", err)
	}
	var gen int64
	if err := t.queryRow(`SELECT kernel_generation FROM sessions WHERE id = ?`, session).Scan(&gen); err != nil {
		return 0, fmt.Errorf("%w: %s", ErrUnknownSession, session)
	}
	content := map[string]any{"generation": gen}
	for k, v := range details {
		content[k] = v
	}
	if err := t.notice(session, "kernel.started", content); err != nil {
		return 0, err
	}
	return gen, nil
}

// KernelReset records that a generation's Python state is gone, and why.
func (t *Tx) KernelReset(session string, generation int64, reason string) error {
	return t.notice(session, "kernel.reset", map[string]any{
		"generation": generation, "reason": reason, "python_state_restored": false,
	})
}

func (t *Tx) notice(session, kind string, content any) error {
	b, err := json.Marshal(content)
	if err != nil {
		return err
	}
	_, _, err = t.appendItem(session, kind, LaneNotice, string(b), t.now, t.now)
	return err
}

// Pin is the behavior a cell was accepted under; it keeps it until it ends.
type Pin struct {
	Epoch   int64  `json:"epoch"`
	Release string `json:"release"`
}

// ToolCall names the model step and call a cell answers.
type ToolCall struct {
	Step int64
	ID   string
}

// StartExecution journals a cell before it runs: its code, generation and
// behavior epoch become a cell.started record and the execution is running.
// A cell that answers a tool call (call non-nil) names it; its outcome will
// answer the call.
func (t *Tx) StartExecution(session string, generation int64, code string, call *ToolCall) (int64, Pin, error) {
	// The cell is pinned to the behavior in force when it was accepted: its
	// epoch and release are part of its record.
	var epoch int64
	var release string
	if err := t.queryRow(`SELECT behavior_epoch, policy_revision FROM sessions WHERE id = ?`, session).Scan(&epoch, &release); err != nil {
		return 0, Pin{}, fmt.Errorf("%w: %s", ErrUnknownSession, session)
	}
	pin := Pin{Epoch: epoch, Release: release}
	rec := map[string]any{"code": code, "generation": generation, "behavior_epoch": epoch, "release": release}
	var step, callID any
	if call != nil {
		rec["tool_call_id"], rec["step_id"] = call.ID, call.Step
		step, callID = call.Step, call.ID
	}
	content, _ := json.Marshal(rec)
	eventID, _, err := t.appendItem(session, "cell.started", LaneCell, string(content), t.now, t.now)
	if err != nil {
		return 0, pin, fmt.Errorf("start execution: %w", err)
	}
	res, err := t.exec(`INSERT INTO executions (session_id, generation, code_event_id, started_at, step_id, call_id) VALUES (?, ?, ?, ?, ?, ?)`,
		session, generation, eventID, t.now.UnixMilli(), step, callID)
	if err != nil {
		return 0, pin, fmt.Errorf("start execution: %w", err)
	}
	id, _ := res.LastInsertId()
	if call != nil {
		if _, err := t.exec(`UPDATE tool_calls SET execution_id = ? WHERE step_id = ? AND call_id = ? AND state = 'pending'`,
			id, call.Step, call.ID); err != nil {
			return 0, pin, fmt.Errorf("start execution: %w", err)
		}
	}
	return id, pin, nil
}

// FinishExecution records a cell's outcome (state and the outcome record's
// content) once. If the cell answers a tool call, the outcome answers it in
// the same commit: a tool result is never lost between the two.
func (t *Tx) FinishExecution(session string, id int64, state string, reset bool, outcome json.RawMessage) error {
	var content map[string]any
	if err := json.Unmarshal(outcome, &content); err != nil {
		return fmt.Errorf("finish execution: outcome: %w", err)
	}
	var step sql.NullInt64
	var callID sql.NullString
	if err := t.queryRow(`SELECT step_id, call_id FROM executions WHERE id = ? AND session_id = ?`, id, session).Scan(&step, &callID); err != nil {
		return fmt.Errorf("finish execution %d: %w", id, err)
	}
	content["execution_id"] = id
	if callID.Valid {
		content["tool_call_id"] = callID.String
	}
	b, _ := json.Marshal(content)
	eventID, _, err := t.appendItem(session, "cell.finished", LaneCell, string(b), t.now, t.now)
	if err != nil {
		return fmt.Errorf("finish execution: %w", err)
	}
	if out, ok := content["output"].(map[string]any); ok {
		if a, ok := out["artifact"].(map[string]any); ok {
			sha, _ := a["sha256"].(string)
			size, _ := a["size"].(float64)
			if len(sha) == 64 {
				if err := t.recordArtifact(sha, int64(size), "text/plain; charset=utf-8", eventID); err != nil {
					return err
				}
			}
		}
	}
	_, err = t.exec(`UPDATE executions SET state = ?, reset = ?, outcome_event_id = ?, finished_at = ? WHERE id = ? AND session_id = ?`,
		state, reset, eventID, t.now.UnixMilli(), id, session)
	if err != nil && strings.Contains(err.Error(), "finishes once") {
		return fmt.Errorf("%w: %d", ErrExecutionFinished, id)
	}
	if err != nil {
		return fmt.Errorf("finish execution: %w", err)
	}
	if step.Valid && callID.Valid {
		ts := ToolDone
		if state == "lost" || state == "cancelled" {
			ts = ToolInterrupted // its result says so, under the call's id
		}
		err := t.AnswerToolCall(session, step.Int64, callID.String, ts, eventID)
		if state == "lost" && errors.Is(err, ErrCallAnswered) {
			// The loop already answered the call (as interrupted) when the
			// cell's outcome could not be recorded: the cell still ends.
			return nil
		}
		return err
	}
	return nil
}

// RecoverExecutions marks the cells a dead run left running as lost: their
// outcome is unknown and they are never replayed.
func (t *Tx) RecoverExecutions() (int64, error) {
	rows, err := t.query(`SELECT id, session_id, generation FROM executions WHERE state = 'running'`)
	if err != nil {
		return 0, fmt.Errorf("recover executions: %w", err)
	}
	type lost struct {
		id, gen int64
		session string
	}
	var ls []lost
	for rows.Next() {
		var l lost
		if err := rows.Scan(&l.id, &l.session, &l.gen); err != nil {
			rows.Close()
			return 0, err
		}
		ls = append(ls, l)
	}
	rows.Close()
	for _, l := range ls {
		out, _ := json.Marshal(map[string]any{"status": "lost", "generation": l.gen,
			"error": map[string]string{"type": "Lost", "message": "klbr-core stopped while this cell ran; its outcome is unknown and it was not replayed"}})
		if err := t.FinishExecution(l.session, l.id, "lost", true, out); err != nil {
			return 0, err
		}
	}
	return int64(len(ls)), nil
}

// KernelGenerationEnded reports whether session's generation gen has ended:
// a kernel.reset notice names it (a reset, a loss, a failed start).
func (s *Store) KernelGenerationEnded(ctx context.Context, session string, gen int64) (bool, error) {
	var n int64
	err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM events WHERE session_id = ? AND kind = 'kernel.reset'
		AND json_extract(content, '$.generation') = ?`, session, gen).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("kernel generation ended: %w", err)
	}
	return n > 0, nil
}
