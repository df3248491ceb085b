package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
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
		return fmt.Errorf("%w: tool call %s of step %d is not pending", ErrCallAnswered, callID, step)
	}
	return t.addContext(session, "tool", eventID, callID)
}

// ErrCallAnswered reports an answer to a tool call that already has one.
var ErrCallAnswered = errors.New("tool call already answered")

// addContext appends an event to the session's current context epoch, as
// an item and as an entry of the active context. An input's scope is where
// it came from; everything else is the agent's own.
func (t *Tx) addContext(session, role string, eventID int64, callID string) error {
	var call any
	if callID != "" {
		call = callID
	}
	res, err := t.exec(`INSERT INTO context_items (session_id, context_epoch, role, event_id, call_id, scope)
		SELECT id, context_epoch, ?, ?, ?, COALESCE((SELECT CASE i.source_kind WHEN 'operator' THEN 'operator'
			WHEN 'job' THEN 'agent' WHEN 'source' THEN i.conversation
			ELSE 'discord:' || i.conversation END FROM inputs i WHERE i.event_id = ?), 'agent')
		FROM sessions WHERE id = ?`, role, eventID, call, eventID, session)
	if err != nil {
		return fmt.Errorf("context item: %w", err)
	}
	id, _ := res.LastInsertId()
	if _, err := t.exec(`INSERT INTO context_entries (session_id, context_epoch, position, item_id)
		SELECT session_id, context_epoch, id, id FROM context_items WHERE id = ?`, id); err != nil {
		return fmt.Errorf("context entry: %w", err)
	}
	return nil
}

// ErrNoAttempt reports a turn-loop write about an attempt that is not running.
var ErrNoAttempt = errors.New("attempt is not running")

// Attempt states (attempts.state).
const (
	AttemptRunning     = "running"
	AttemptIdle        = "idle"
	AttemptWaiting     = "waiting"
	AttemptPaused      = "paused"
	AttemptInterrupted = "interrupted"
	AttemptFailed      = "failed"
)

// NewAttempt starts a run of model steps.
type NewAttempt struct {
	Session    string
	Frame      int64 // 0: woken without a frame (a deadline, a restart)
	WakeReason string
	// TraceID is the attempt's trace ([telemetry]), hex; "" when off.
	TraceID string
}

// StartAttempt records a new running attempt, pinned to the session's
// active release, and moves the session to running from the state it is in
// (ready or waiting). It returns the attempt id and the context epoch it
// runs in.
func (t *Tx) StartAttempt(a NewAttempt) (id, epoch int64, err error) {
	s, err := t.Session(a.Session)
	if err != nil {
		return 0, 0, err
	}
	if s.State != StateRunning {
		if err := t.TransitionSession(a.Session, s.State, StateRunning, a.WakeReason); err != nil {
			return 0, 0, err
		}
	}
	var frame any
	if a.Frame != 0 {
		frame = a.Frame
	}
	var trace any
	if a.TraceID != "" {
		trace = a.TraceID
	}
	res, err := t.exec(`INSERT INTO attempts (session_id, frame_id, wake_reason, context_epoch, release, behavior_epoch, started_at, trace_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		a.Session, frame, a.WakeReason, s.ContextEpoch, s.PolicyRevision, s.BehaviorEpoch, t.now.UnixMilli(), trace)
	if err != nil {
		return 0, 0, fmt.Errorf("start attempt: %w", err)
	}
	id, _ = res.LastInsertId()
	return id, s.ContextEpoch, nil
}

// FinishAttempt ends a running attempt with its state and a short outcome.
func (t *Tx) FinishAttempt(id int64, state, outcome string) error {
	res, err := t.exec(`UPDATE attempts SET state = ?, outcome = ?, finished_at = ? WHERE id = ? AND state = 'running'`,
		state, outcome, t.now.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("finish attempt %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %d", ErrNoAttempt, id)
	}
	return nil
}

// TakeFrame freezes a frame of claimed inputs for a running attempt (CommitFrame),
// and appends the inputs to the current context in input order. attempt 0
// means the frame starts the attempt (StartAttempt links it).
func (t *Tx) TakeFrame(f Frame, attempt int64) (int64, error) {
	frameID, err := t.CommitFrame(f)
	if err != nil {
		return 0, err
	}
	if attempt != 0 {
		if _, err := t.exec(`INSERT INTO attempt_frames (attempt_id, frame_id) VALUES (?, ?)`, attempt, frameID); err != nil {
			return 0, fmt.Errorf("take frame: %w", err)
		}
	}
	ids := append([]int64(nil), f.InputIDs...)
	slices.Sort(ids)
	for _, id := range ids {
		var eventID int64
		if err := t.queryRow(`SELECT event_id FROM inputs WHERE id = ?`, id).Scan(&eventID); err != nil {
			return 0, fmt.Errorf("take frame: input %d: %w", id, err)
		}
		if err := t.addContext(f.Session, "input", eventID, ""); err != nil {
			return 0, err
		}
	}
	return frameID, nil
}

// StepUsage is a step's token accounting as the provider reported it; nil
// is "not reported".
type StepUsage struct {
	Prompt     *int `json:"prompt,omitempty"`
	Completion *int `json:"completion,omitempty"`
	CacheRead  *int `json:"cache_read,omitempty"`
	CacheWrite *int `json:"cache_write,omitempty"`
	CacheMiss  *int `json:"cache_miss,omitempty"` // DeepSeek's prompt_cache_miss_tokens
}

// StepCall is one tool call of a response, as the model wrote it.
type StepCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// IDMadeUp is set when ID had to be made up (the model sent none, or
	// one an earlier call of the response had); SentID is then what it
	// sent. Results answer ID.
	IDMadeUp bool   `json:"id_made_up,omitempty"`
	SentID   string `json:"sent_id,omitempty"`
}

// StepResult is what a model step produced. A complete step's scratchpad and
// tool calls enter the context; a partial one (the stream was cut off) is
// recorded for the operator and never runs or enters the context.
type StepResult struct {
	Session string
	Attempt int64
	// TraceID is the attempt's trace ("" when tracing is off): the
	// scratchpad record carries it so tail and the browser can link it.
	TraceID        string
	Ordinal        int       // the step's number within its attempt, from 1
	Started        time.Time // when the request was sent
	Route          string
	State          string // completed, failed, interrupted
	Error          string
	Text           string
	Reasoning      string
	ReasoningField string
	// ReasoningDetails is the provider's reasoning_details array, kept to
	// be sent back to the routes that want it.
	ReasoningDetails json.RawMessage
	Calls            []StepCall
	FinishReason     string
	Usage            StepUsage
	// Estimated is the host's estimate of the request's prompt tokens (0:
	// none), kept beside the reported usage to calibrate later estimates.
	Estimated int
	// CostUSD and CostSource are the step's cost for the spend ledger
	// (nil, CostNone: counted in tokens only). The ledger row is committed
	// with the step.
	CostUSD    *float64
	CostSource string
	// NotSent marks a step whose request ended before it left the host
	// (e.g. interrupted while it waited at a spend cap): it cost nothing
	// and has no ledger row.
	NotSent bool
}

// scratchpad is the record of a step's model output.
type scratchpad struct {
	Attempt        int64  `json:"attempt"`
	TraceID        string `json:"trace_id,omitempty"`
	Step           int    `json:"step"`    // within the attempt: live deltas carry the same number
	StepID         int64  `json:"step_id"` // the model step's id: its tool calls' cells name it
	Route          string `json:"route"`
	Text           string `json:"text"`
	Reasoning      string `json:"reasoning,omitempty"`
	ReasoningField string `json:"reasoning_field,omitempty"`
	// ReasoningDetails is kept raw (json.RawMessage) so it goes back as it came.
	ReasoningDetails json.RawMessage `json:"reasoning_details,omitempty"`
	Calls            []StepCall      `json:"tool_calls"`
	Partial          bool            `json:"partial"`
	FinishReason     string          `json:"finish_reason,omitempty"`
	Usage            StepUsage       `json:"usage"`
}

// RecordStep records a model step and its response before anything in it
// runs: the step with its usage, the scratchpad record (if the model wrote
// anything), its tool calls as pending, and the attempt's step and token
// counts. It returns the step's id. (The step is recorded once, when its
// response is complete or cut off: an attempt's count of steps is the
// budget, and a crash during a request leaves nothing to close.)
func (t *Tx) RecordStep(r StepResult) (int64, error) {
	complete := r.State == "completed"
	if !complete {
		r.Calls = nil // never run, never replayed
	}
	tokens := 0
	if r.Usage.Prompt != nil {
		tokens += *r.Usage.Prompt
	}
	if r.Usage.Completion != nil {
		tokens += *r.Usage.Completion
	}
	res, err := t.exec(`UPDATE attempts SET steps = steps + 1, tokens = tokens + ? WHERE id = ? AND session_id = ? AND state = 'running'`,
		tokens, r.Attempt, r.Session)
	if err != nil {
		return 0, fmt.Errorf("record step: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return 0, fmt.Errorf("%w: %d", ErrNoAttempt, r.Attempt)
	}
	var estimated any
	if r.Estimated > 0 {
		estimated = r.Estimated
	}
	res, err = t.exec(`INSERT INTO model_steps (attempt_id, session_id, route, state, error, prompt_tokens, completion_tokens,
		cache_read_tokens, cache_write_tokens, cache_miss_tokens, started_at, finished_at, estimated_tokens)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.Attempt, r.Session, r.Route, r.State, r.Error, r.Usage.Prompt, r.Usage.Completion, r.Usage.CacheRead, r.Usage.CacheWrite,
		r.Usage.CacheMiss, r.Started.UnixMilli(), t.now.UnixMilli(), estimated)
	if err != nil {
		return 0, fmt.Errorf("record step: %w", err)
	}
	stepID, _ := res.LastInsertId()
	if !r.NotSent { // no request left the host: no ledger row
		if err := t.RecordSpend(SpendEntry{Session: r.Session, Route: r.Route, Purpose: "turn", Prompt: deref(r.Usage.Prompt),
			Completion: deref(r.Usage.Completion), CacheRead: deref(r.Usage.CacheRead), CacheWrite: deref(r.Usage.CacheWrite),
			CostUSD: r.CostUSD, CostSource: r.CostSource}, stepID); err != nil {
			return 0, err
		}
	}
	if r.Text != "" || r.Reasoning != "" || len(r.Calls) > 0 {
		calls := r.Calls
		if calls == nil {
			calls = []StepCall{}
		}
		b, err := json.Marshal(scratchpad{Attempt: r.Attempt, TraceID: r.TraceID, Step: r.Ordinal, StepID: stepID, Route: r.Route, Text: r.Text,
			Reasoning: r.Reasoning, ReasoningField: r.ReasoningField, ReasoningDetails: validJSON(r.ReasoningDetails), Calls: calls, Partial: !complete,
			FinishReason: r.FinishReason, Usage: r.Usage})
		if err != nil {
			return 0, err
		}
		eventID, _, err := t.appendItem(r.Session, "scratchpad", LaneScratchpad, string(b), t.now, t.now)
		if err != nil {
			return 0, err
		}
		if _, err := t.exec(`UPDATE model_steps SET response_event_id = ? WHERE id = ?`, eventID, stepID); err != nil {
			return 0, fmt.Errorf("record step: %w", err)
		}
		if complete {
			if err := t.addContext(r.Session, "assistant", eventID, ""); err != nil {
				return 0, err
			}
		}
	}
	for i, c := range r.Calls {
		if _, err := t.exec(`INSERT INTO tool_calls (step_id, call_id, session_id, position) VALUES (?, ?, ?, ?)`,
			stepID, c.ID, r.Session, i); err != nil {
			return 0, fmt.Errorf("record step: tool call %q: %w", c.ID, err)
		}
	}
	return stepID, nil
}

// CloseToolCall answers a pending call that no cell answered: its arguments
// were invalid, it was interrupted, or an earlier call of its group waited.
// The answer is an explicit tool.unrun record under the call's id.
func (t *Tx) CloseToolCall(session string, step int64, callID string, state ToolState, message string) error {
	b, _ := json.Marshal(map[string]any{"tool_call_id": callID, "step_id": step, "state": state, "message": message})
	eventID, _, err := t.appendItem(session, "tool.unrun", LaneCell, string(b), t.now, t.now)
	if err != nil {
		return err
	}
	return t.AnswerToolCall(session, step, callID, state, eventID)
}

// Notice appends a notice record; a modelVisible one also enters the
// session's context (a wake reason, a delivery reminder).
func (t *Tx) Notice(session, kind string, content any, modelVisible bool) (int64, error) {
	b, err := json.Marshal(content)
	if err != nil {
		return 0, err
	}
	eventID, _, err := t.appendItem(session, kind, LaneNotice, string(b), t.now, t.now)
	if err != nil {
		return 0, err
	}
	if modelVisible {
		return eventID, t.addContext(session, "notice", eventID, "")
	}
	return eventID, nil
}

// PendingInput is a pending input as the scheduler plans it.
type PendingInput struct {
	ID           int64
	SourceKind   string
	Directed     bool
	Conversation string
	ReceivedAt   time.Time
}

// PendingInputs lists session's pending inputs, oldest first.
func (t *Tx) PendingInputs(session string) ([]PendingInput, error) {
	return scanPending(t.query(pendingQuery, session))
}

// PendingInputs lists session's pending inputs, oldest first (a read).
func (s *Store) PendingInputs(ctx context.Context, session string) ([]PendingInput, error) {
	return scanPending(s.rdb.QueryContext(ctx, pendingQuery, session))
}

const pendingQuery = `SELECT i.id, i.source_kind, i.directed, i.conversation, i.received_at
	FROM inbox b JOIN inputs i ON i.id = b.input_id
	WHERE b.session_id = ? AND b.state = 'pending' ORDER BY i.id`

func scanPending(rows *sql.Rows, err error) ([]PendingInput, error) {
	if err != nil {
		return nil, fmt.Errorf("pending inputs: %w", err)
	}
	defer rows.Close()
	var out []PendingInput
	for rows.Next() {
		var p PendingInput
		var rec int64
		if err := rows.Scan(&p.ID, &p.SourceKind, &p.Directed, &p.Conversation, &rec); err != nil {
			return nil, fmt.Errorf("pending inputs: %w", err)
		}
		p.ReceivedAt = time.UnixMilli(rec)
		out = append(out, p)
	}
	return out, rows.Err()
}

// ClaimInputs moves the given pending inputs of session to claimed.
func (t *Tx) ClaimInputs(session string, ids []int64) error {
	for _, id := range ids {
		if err := t.moveInbox(id, InboxPending, InboxClaimed, nil); err != nil {
			return err
		}
	}
	return nil
}

// Wait is a terminal wait to commit.
type Wait struct {
	Session   string
	Attempt   int64
	Execution int64      // the cell that waited, 0 if none
	Deadline  *time.Time // nil: until input
	Seconds   *float64
	Reason    string
	// Ready decides whether pending inputs (read in the same transaction)
	// should wake the session at once instead: the inputs an attention plan
	// defers do not.
	Ready func([]PendingInput) bool
}

// CommitWait is the one transaction that decides a wait: if input is ready,
// the session does not wait (woken is true) and the caller takes it in;
// else the attempt ends waiting, the session moves to waiting and the
// wakeup is armed. An input admitted after this commit wakes the session
// through the store's watch, so no input is stranded in between.
func (t *Tx) CommitWait(w Wait) (woken bool, err error) {
	pending, err := t.PendingInputs(w.Session)
	if err != nil {
		return false, err
	}
	if len(pending) > 0 && (w.Ready == nil || w.Ready(pending)) {
		return true, nil
	}
	if err := t.FinishAttempt(w.Attempt, AttemptWaiting, w.Reason); err != nil {
		return false, err
	}
	if err := t.TransitionSession(w.Session, StateRunning, StateWaiting, w.Reason); err != nil {
		return false, err
	}
	var deadline, exec any
	var deadlineMs *int64
	if w.Deadline != nil {
		ms := w.Deadline.UnixMilli()
		deadline, deadlineMs = ms, &ms
	}
	if w.Execution != 0 {
		exec = w.Execution
	}
	if _, err := t.exec(`INSERT INTO wakeups (session_id, attempt_id, execution_id, deadline, reason, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
		w.Session, w.Attempt, exec, deadline, w.Reason, t.now.UnixMilli()); err != nil {
		return false, fmt.Errorf("commit wait: %w", err)
	}
	_, err = t.Notice(w.Session, "wait.started", map[string]any{"attempt": w.Attempt, "seconds": w.Seconds,
		"deadline": deadlineMs, "reason": w.Reason}, false)
	return false, err
}

// Wakeup is an armed wait.
type Wakeup struct {
	ID       int64      `json:"id"`
	Attempt  int64      `json:"attempt"`
	Deadline *time.Time `json:"deadline,omitempty"`
	Reason   string     `json:"reason"`
	Created  time.Time  `json:"created"`
}

const wakeupSelect = `SELECT id, attempt_id, deadline, reason, created_at FROM wakeups WHERE session_id = ? AND state = 'armed'`

func scanWakeup(row *sql.Row) (*Wakeup, error) {
	var w Wakeup
	var deadline sql.NullInt64
	var created int64
	if err := row.Scan(&w.ID, &w.Attempt, &deadline, &w.Reason, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		return nil, fmt.Errorf("wakeup: %w", err)
	}
	if deadline.Valid {
		d := time.UnixMilli(deadline.Int64)
		w.Deadline = &d
	}
	w.Created = time.UnixMilli(created)
	return &w, nil
}

// ArmedWakeup returns session's armed wait, or nil.
func (s *Store) ArmedWakeup(ctx context.Context, session string) (*Wakeup, error) {
	return scanWakeup(s.rdb.QueryRowContext(ctx, wakeupSelect, session))
}

// FireWakeup fires session's armed wait once, by "input", "deadline",
// "operator" or "restart", and records a model-visible wait.woken notice. It
// returns nil when no wait was armed (another path fired it first).
func (t *Tx) FireWakeup(session, by string) (*Wakeup, error) {
	w, err := scanWakeup(t.queryRow(wakeupSelect, session))
	if err != nil || w == nil {
		return nil, err
	}
	if by == "deadline" && (w.Deadline == nil || t.now.Before(*w.Deadline)) {
		return nil, nil // not due: a stale timer
	}
	if _, err := t.exec(`UPDATE wakeups SET state = 'fired', fired_by = ?, fired_at = ? WHERE id = ? AND state = 'armed'`,
		by, t.now.UnixMilli(), w.ID); err != nil {
		return nil, fmt.Errorf("fire wakeup: %w", err)
	}
	_, err = t.Notice(session, "wait.woken", map[string]any{"by": by, "reason": w.Reason,
		"waited_ms": t.now.Sub(w.Created).Milliseconds()}, true)
	return w, err
}

// CancelWakeup cancels session's armed wait (the operator stopped or reset it).
func (t *Tx) CancelWakeup(session string) error {
	_, err := t.exec(`UPDATE wakeups SET state = 'cancelled', fired_at = ? WHERE session_id = ? AND state = 'armed'`, t.now.UnixMilli(), session)
	return err
}

// ContextItem is one entry of the model-visible transcript.
type ContextItem struct {
	ID      int64
	Role    string // input, assistant, tool, notice
	Kind    string // the event's kind
	CallID  string
	Content json.RawMessage
	// Collected is set when retention collected the original (Content is a
	// stub). Migration 0026 collects only what a summary covers, which
	// never returns to an active context, so the turn loop should not meet
	// one; it renders it as collected if it does.
	Collected *Collection
	// Discord is where a Discord input came from, for the model to address
	// it (nil for other items).
	Discord *DiscordSource
}

// DiscordSource is a Discord input's handles as the model sees them.
type DiscordSource struct {
	Alias     string // the conversation's durable alias, d1, d2, …
	Kind      string // dm, channel, thread
	Name      string // the channel's name, if known
	Mode      string // dm, mention, ambient, gap
	MessageID string
	Item      int64 // its attention item (DMs and mentions), else 0
	// Attachments are the message's attachments (metadata; the bytes are
	// fetched apart from admission, if at all).
	Attachments []Attachment
	// InputID is the message's input (read with the active context only).
	InputID int64
}

// Context returns session's transcript in context epoch after item id
// after (0: from the start), in order.
func (s *Store) Context(ctx context.Context, session string, epoch, after int64) ([]ContextItem, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT c.id, c.role, e.kind, COALESCE(c.call_id, ''), e.content,
			d.alias, d.kind, d.name, m.mode, m.message_id, a.id, `+attachmentsExpr+`,
			e.collected_at, e.collected_reason, e.collected_bytes
		FROM context_items c JOIN events e ON e.id = c.event_id
		LEFT JOIN inputs i ON c.role = 'input' AND i.event_id = c.event_id
		LEFT JOIN discord_messages m ON m.input_id = i.id
		LEFT JOIN discord_conversations d ON d.id = m.conversation_id
		LEFT JOIN attention_items a ON a.input_id = i.id
		WHERE c.session_id = ? AND c.context_epoch = ? AND c.id > ? ORDER BY c.id`, session, epoch, after)
	if err != nil {
		return nil, fmt.Errorf("context: %w", err)
	}
	defer rows.Close()
	var out []ContextItem
	for rows.Next() {
		var c ContextItem
		var content string
		var alias, kind, name, mode, msg, att sql.NullString
		var item, collected sql.NullInt64
		var reason string
		var collectedBytes int64
		if err := rows.Scan(&c.ID, &c.Role, &c.Kind, &c.CallID, &content, &alias, &kind, &name, &mode, &msg, &item, &att,
			&collected, &reason, &collectedBytes); err != nil {
			return nil, fmt.Errorf("context: %w", err)
		}
		c.Content = json.RawMessage(content)
		c.Collected = collection(collected, reason, collectedBytes)
		if alias.Valid {
			c.Discord = &DiscordSource{Alias: alias.String, Kind: kind.String, Name: name.String, Mode: mode.String,
				MessageID: msg.String, Item: item.Int64, Attachments: parseAttachments(att.String)}
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// ResetContext starts a new context epoch: the archive stays, the model's
// next request starts from an empty transcript. Durable work is untouched.
func (t *Tx) ResetContext(session, reason string) (int64, error) {
	if _, err := t.exec(`UPDATE sessions SET context_epoch = context_epoch + 1, updated_at = ? WHERE id = ?`, t.now.UnixMilli(), session); err != nil {
		return 0, fmt.Errorf("reset context: %w", err)
	}
	s, err := t.Session(session)
	if err != nil {
		return 0, err
	}
	_, err = t.Notice(session, "context.reset", map[string]any{"epoch": s.ContextEpoch, "reason": reason}, false)
	return s.ContextEpoch, err
}

// Recovered is what RecoverTurns found of a dead run.
type Recovered struct {
	Sessions []string // sessions that were running an attempt: they resume
	Attempts int64
	Calls    int64
}

// RecoverTurns closes what a dead run left open (call it after
// RecoverExecutions, at start, when no attempt can be alive): requested model
// steps become interrupted, tool calls no cell answered are answered as
// interrupted under their ids, running attempts become interrupted, and
// running sessions become ready so the loop resumes them.
func (t *Tx) RecoverTurns() (Recovered, error) {
	var r Recovered
	if _, err := t.exec(`UPDATE model_steps SET state = 'interrupted', error = 'klbr-core stopped during the model request', finished_at = ? WHERE state = 'requested'`, t.now.UnixMilli()); err != nil {
		return r, fmt.Errorf("recover turns: %w", err)
	}
	rows, err := t.query(`SELECT session_id, step_id, call_id FROM tool_calls WHERE state = 'pending' ORDER BY step_id, position`)
	if err != nil {
		return r, fmt.Errorf("recover turns: %w", err)
	}
	type open struct {
		session, call string
		step          int64
	}
	var calls []open
	for rows.Next() {
		var o open
		if err := rows.Scan(&o.session, &o.step, &o.call); err != nil {
			rows.Close()
			return r, err
		}
		calls = append(calls, o)
	}
	rows.Close()
	for _, o := range calls {
		if err := t.CloseToolCall(o.session, o.step, o.call, ToolInterrupted,
			"not run: klbr-core stopped before this call ran; it was not replayed"); err != nil {
			return r, err
		}
	}
	r.Calls = int64(len(calls))
	res, err := t.exec(`UPDATE attempts SET state = 'interrupted', outcome = 'klbr-core stopped during the attempt', finished_at = ? WHERE state = 'running'`, t.now.UnixMilli())
	if err != nil {
		return r, fmt.Errorf("recover turns: %w", err)
	}
	r.Attempts, _ = res.RowsAffected()
	srows, err := t.query(`SELECT id FROM sessions WHERE state = 'running' ORDER BY id`)
	if err != nil {
		return r, fmt.Errorf("recover turns: %w", err)
	}
	for srows.Next() {
		var id string
		if err := srows.Scan(&id); err != nil {
			srows.Close()
			return r, err
		}
		r.Sessions = append(r.Sessions, id)
	}
	srows.Close()
	for _, id := range r.Sessions {
		if err := t.TransitionSession(id, StateRunning, StateReady, "klbr-core restarted during an attempt"); err != nil {
			return r, err
		}
	}
	return r, nil
}

// TurnStatus is a session's loop as status shows it.
type TurnStatus struct {
	Attempt *AttemptInfo `json:"attempt,omitempty"` // the running or last attempt
	Wait    *Wakeup      `json:"wait,omitempty"`
}

// AttemptInfo describes one attempt.
type AttemptInfo struct {
	ID         int64     `json:"id"`
	State      string    `json:"state"`
	WakeReason string    `json:"wake_reason"`
	Outcome    string    `json:"outcome,omitempty"`
	Steps      int64     `json:"steps"`
	Tokens     int64     `json:"tokens"`
	StartedAt  time.Time `json:"started_at"`
	// The behavior release the attempt runs under, and its epoch.
	Release       string `json:"release"`
	BehaviorEpoch int64  `json:"behavior_epoch"`
	// TraceID is the attempt's OpenTelemetry trace, when tracing was on.
	TraceID string `json:"trace_id,omitempty"`
}

// Turn returns session's latest attempt and armed wait.
func (s *Store) Turn(ctx context.Context, session string) (TurnStatus, error) {
	var ts TurnStatus
	var a AttemptInfo
	var started int64
	err := s.rdb.QueryRowContext(ctx, `SELECT id, state, wake_reason, outcome, steps, tokens, started_at, release, behavior_epoch, COALESCE(trace_id, '') FROM attempts
		WHERE session_id = ? ORDER BY id DESC LIMIT 1`, session).Scan(&a.ID, &a.State, &a.WakeReason, &a.Outcome, &a.Steps, &a.Tokens, &started,
		&a.Release, &a.BehaviorEpoch, &a.TraceID)
	switch {
	case err == nil:
		a.StartedAt = time.UnixMilli(started)
		ts.Attempt = &a
	case !errors.Is(err, sql.ErrNoRows):
		return ts, fmt.Errorf("turn status: %w", err)
	}
	ts.Wait, err = s.ArmedWakeup(ctx, session)
	return ts, err
}

// AttemptAnswers counts the evidence that an attempt answered what it was
// addressed with: local sends (confirmed or held) and Discord effects made
// by its cells, and attention decisions the model made while it ran.
func (s *Store) AttemptAnswers(ctx context.Context, attempt int64) (int64, error) {
	var n int64
	err := s.rdb.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM local_deliveries d JOIN executions x ON x.id = d.execution_id
			JOIN model_steps m ON m.id = x.step_id WHERE m.attempt_id = a.id)
		+ (SELECT count(*) FROM discord_outbox o JOIN executions x ON x.id = o.execution_id
			JOIN model_steps m ON m.id = x.step_id WHERE m.attempt_id = a.id)
		+ (SELECT count(*) FROM attention_decisions d JOIN attention_items i ON i.id = d.item_id
			WHERE i.session_id = a.session_id AND d.origin = 'model' AND d.at >= a.started_at)
		FROM attempts a WHERE a.id = ?`, attempt).Scan(&n)
	return n, err
}

// Glance is what the turn loop checks at each boundary, in one read: the
// session's state and versions, and its pending inputs by kind.
type Glance struct {
	Session
	PendingOperator int64
	PendingOther    int64
}

// Glance reads session's glance.
func (s *Store) Glance(ctx context.Context, id string) (Glance, error) {
	var g Glance
	var created, updated int64
	err := s.rdb.QueryRowContext(ctx, `SELECT s.id, COALESCE(s.parent_id, ''), s.state, s.state_reason, s.context_epoch, s.policy_revision,
			s.kernel_generation, s.behavior_epoch, s.created_at, s.updated_at,
			(SELECT COALESCE(sum(k.pending), 0) FROM inbox_backlog k WHERE k.session_id = s.id AND k.source_kind = 'operator'),
			(SELECT COALESCE(sum(k.pending), 0) FROM inbox_backlog k WHERE k.session_id = s.id AND k.source_kind <> 'operator')
		FROM sessions s WHERE s.id = ?`, id).Scan(&g.ID, &g.ParentID, &g.State, &g.StateReason, &g.ContextEpoch, &g.PolicyRevision,
		&g.KernelGen, &g.BehaviorEpoch, &created, &updated, &g.PendingOperator, &g.PendingOther)
	if errors.Is(err, sql.ErrNoRows) {
		return g, fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	if err != nil {
		return g, fmt.Errorf("read session %s: %w", id, err)
	}
	g.CreatedAt, g.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return g, nil
}

// validJSON returns raw when it is valid JSON, else nil (a record must
// marshal).
func validJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || !json.Valid(raw) {
		return nil
	}
	return raw
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
