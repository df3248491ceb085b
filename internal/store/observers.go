package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ObserverEvent is a committed event an observer may be bound to.
type ObserverEvent struct {
	ID           int64           `json:"id"`
	Session      string          `json:"session"`
	Kind         string          `json:"kind"`
	Data         json.RawMessage `json:"data"`
	Depth        int             `json:"depth"`
	CauseCommand int64           `json:"cause_command,omitempty"`
	At           time.Time       `json:"at"`
}

// ObserverBinding is one observer handler's binding in a session.
type ObserverBinding struct {
	Session      string   `json:"session"`
	Handler      string   `json:"handler"`
	Release      string   `json:"release"`
	Events       []string `json:"events"`
	Cursor       int64    `json:"cursor"`
	StateVersion int      `json:"state_version"`
	Paused       string   `json:"paused,omitempty"`
}

// BindObserver records that release binds handler to events in session. A
// handler bound for the first time starts at the newest event: history is
// never delivered to it; a new release of a bound handler keeps its cursor
// (nothing completed is delivered again). When the handler's stored state
// has another schema version than version and migratesFrom does not list
// it, the binding is paused with a notice until a release declares one.
func (t *Tx) BindObserver(session, handler, release string, events []string, version int, migratesFrom []int) (ObserverBinding, error) {
	b := ObserverBinding{Session: session, Handler: handler, Release: release, Events: events, StateVersion: version}
	ev, _ := json.Marshal(events)
	var oldRelease, oldPaused, oldEvents string
	var oldVersion int
	err := t.queryRow(`SELECT release_id, cursor, state_version, paused, events FROM observer_bindings WHERE session_id = ? AND handler = ?`,
		session, handler).Scan(&oldRelease, &b.Cursor, &oldVersion, &oldPaused, &oldEvents)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := t.queryRow(`SELECT COALESCE(MAX(id), 0) FROM observer_events`).Scan(&b.Cursor); err != nil {
			return b, fmt.Errorf("bind observer: %w", err)
		}
		oldRelease = ""
	case err != nil:
		return b, fmt.Errorf("bind observer: %w", err)
	}
	var stored sql.NullInt64
	if err := t.queryRow(`SELECT version FROM hook_state WHERE session_id = ? AND namespace = ?`, session, handler).Scan(&stored); err != nil &&
		!errors.Is(err, sql.ErrNoRows) {
		return b, fmt.Errorf("bind observer: %w", err)
	}
	if strings.HasPrefix(oldPaused, unboundPrefix) {
		// Bound again after a release that did not bind it: what happened
		// meanwhile is history, not delivered.
		if err := t.queryRow(`SELECT COALESCE(MAX(id), 0) FROM observer_events`).Scan(&b.Cursor); err != nil {
			return b, fmt.Errorf("bind observer: %w", err)
		}
		if _, err := t.exec(`UPDATE observer_bindings SET cursor = ? WHERE session_id = ? AND handler = ?`, b.Cursor, session, handler); err != nil {
			return b, fmt.Errorf("bind observer: %w", err)
		}
	}
	if stored.Valid && int(stored.Int64) != version && !slices.Contains(migratesFrom, int(stored.Int64)) {
		b.Paused = fmt.Sprintf("its state has schema version %d; release %.12s declares version %d without migrating from %d (migrates_from)",
			stored.Int64, release, version, stored.Int64)
	}
	if oldRelease == release && oldPaused == b.Paused && oldEvents == string(ev) && oldVersion == version {
		return b, nil // unchanged
	}
	if _, err := t.exec(`INSERT INTO observer_bindings (session_id, handler, release_id, events, cursor, state_version, paused, bound_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (session_id, handler) DO UPDATE SET release_id = excluded.release_id, events = excluded.events,
			state_version = excluded.state_version, paused = excluded.paused, bound_at = excluded.bound_at, cursor = excluded.cursor`,
		session, handler, release, string(ev), b.Cursor, version, b.Paused, t.now.UnixMilli()); err != nil {
		return b, fmt.Errorf("bind observer: %w", err)
	}
	if b.Paused != "" && b.Paused != oldPaused {
		if _, err := t.Notice(session, "hooks.observer_paused", map[string]any{"handler": handler, "release": release,
			"message": "observer " + handler + " is paused: " + b.Paused}, false); err != nil {
			return b, err
		}
	}
	return b, nil
}

// ProjectObserver turns up to limit events after the binding's cursor into
// deliveries of the kinds it is bound to, and moves the cursor past them.
// It returns how many events it looked at.
func (t *Tx) ProjectObserver(session, handler string, limit int) (int, error) {
	var cursor int64
	var events string
	if err := t.queryRow(`SELECT cursor, events FROM observer_bindings WHERE session_id = ? AND handler = ? AND paused = ''`,
		session, handler).Scan(&cursor, &events); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("project observer: %w", err)
	}
	var last sql.NullInt64
	var n int
	if err := t.queryRow(`SELECT MAX(id), COUNT(*) FROM (SELECT id FROM observer_events WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?)`,
		session, cursor, limit).Scan(&last, &n); err != nil {
		return 0, fmt.Errorf("project observer: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	if _, err := t.exec(`INSERT OR IGNORE INTO observer_deliveries (session_id, handler, event_id, next_at, created_at)
		SELECT ?, ?, id, ?, ? FROM observer_events
		WHERE session_id = ? AND id > ? AND id <= ? AND kind IN (SELECT value FROM json_each(?))`,
		session, handler, t.now.UnixMilli(), t.now.UnixMilli(), session, cursor, last.Int64, events); err != nil {
		return 0, fmt.Errorf("project observer: %w", err)
	}
	if _, err := t.exec(`UPDATE observer_bindings SET cursor = ? WHERE session_id = ? AND handler = ?`, last.Int64, session, handler); err != nil {
		return 0, fmt.Errorf("project observer: %w", err)
	}
	return n, nil
}

// ObserverDelivery is a pending delivery with its event and the handler's state.
type ObserverDelivery struct {
	ID           int64           `json:"id"`
	Handler      string          `json:"handler"`
	Attempts     int             `json:"attempts"`
	NextAt       time.Time       `json:"next_at"`
	Event        ObserverEvent   `json:"event"`
	State        json.RawMessage `json:"state"`
	StateVersion int             `json:"state_version"` // of State (0: none yet)
}

// NextObserverDelivery returns the oldest pending delivery of handler in
// session (deliveries are made in order, one at a time), or nil.
func (s *Store) NextObserverDelivery(ctx context.Context, session, handler string) (*ObserverDelivery, error) {
	var d ObserverDelivery
	var next, at int64
	var cause sql.NullInt64
	var data string
	err := s.rdb.QueryRowContext(ctx, `SELECT d.id, d.attempts, d.next_at, e.id, e.kind, e.data, e.depth, e.cause_command, e.created_at
		FROM observer_deliveries d JOIN observer_events e ON e.id = d.event_id
		WHERE d.session_id = ? AND d.handler = ? AND d.state = 'pending' ORDER BY d.id LIMIT 1`, session, handler).
		Scan(&d.ID, &d.Attempts, &next, &d.Event.ID, &d.Event.Kind, &data, &d.Event.Depth, &cause, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("observer delivery: %w", err)
	}
	d.Handler, d.Event.Session, d.Event.Data = handler, session, json.RawMessage(data)
	d.Event.CauseCommand, d.NextAt, d.Event.At = cause.Int64, time.UnixMilli(next), time.UnixMilli(at)
	d.State, d.StateVersion, err = s.hookState(ctx, session, handler)
	return &d, err
}

func (s *Store) hookState(ctx context.Context, session, namespace string) (json.RawMessage, int, error) {
	var state string
	var version int
	err := s.rdb.QueryRowContext(ctx, `SELECT state, version FROM hook_state WHERE session_id = ? AND namespace = ?`, session, namespace).
		Scan(&state, &version)
	if errors.Is(err, sql.ErrNoRows) {
		return json.RawMessage(`{}`), 0, nil
	}
	return json.RawMessage(state), version, err
}

// HookState returns a hook module's state and its schema version.
func (s *Store) HookState(ctx context.Context, session, namespace string) (json.RawMessage, int, error) {
	return s.hookState(ctx, session, namespace)
}

// MaxHookState bounds one namespace's state (JSON bytes).
const MaxHookState = 64 << 10

// ProposedCommand is a command an observer's answer proposes.
type ProposedCommand struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args"`
}

// Ack is an observer's acknowledgement of a delivery.
type Ack struct {
	Delivery int64
	Release  string
	// State replaces the handler's state (nil: unchanged), at Version.
	State   json.RawMessage
	Version int
	// Commands are minted in the same transaction; those beyond the loop
	// limits are recorded refused, with a notice.
	Commands []ProposedCommand
	Limits   LoopLimits
}

// LoopLimits bound what observers may cause.
type LoopLimits struct {
	MaxDepth int           // a command whose causing event is this deep is refused
	Quota    int           // commands per session per Window
	Window   time.Duration //
}

// ErrDeliverySettled reports an acknowledgement of a delivery that is no
// longer pending.
var ErrDeliverySettled = errors.New("observer delivery already settled")

// AckObserverDelivery settles a pending delivery: its acknowledgement, the
// state update and the proposed commands commit together, so a retried
// delivery never mints commands twice. It returns the ids of the commands
// minted (proposed) and the reasons of those refused.
func (t *Tx) AckObserverDelivery(a Ack) (minted []int64, refused []string, err error) {
	var session, handler string
	var eventID int64
	var depth int
	if err := t.queryRow(`SELECT d.session_id, d.handler, d.event_id, e.depth FROM observer_deliveries d JOIN observer_events e ON e.id = d.event_id
		WHERE d.id = ? AND d.state = 'pending'`, a.Delivery).Scan(&session, &handler, &eventID, &depth); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil, fmt.Errorf("%w: %d", ErrDeliverySettled, a.Delivery)
		}
		return nil, nil, fmt.Errorf("ack observer delivery: %w", err)
	}
	if _, err := t.exec(`UPDATE observer_deliveries SET state = 'done', done_at = ?, release_id = ?, error = '' WHERE id = ?`,
		t.now.UnixMilli(), a.Release, a.Delivery); err != nil {
		return nil, nil, fmt.Errorf("ack observer delivery: %w", err)
	}
	if a.State != nil {
		if len(a.State) > MaxHookState || !json.Valid(a.State) {
			return nil, nil, fmt.Errorf("ack observer delivery: state of %d bytes (at most %d of JSON)", len(a.State), MaxHookState)
		}
		if _, err := t.exec(`INSERT INTO hook_state (session_id, namespace, version, state, updated_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (session_id, namespace) DO UPDATE SET version = excluded.version, state = excluded.state, updated_at = excluded.updated_at`,
			session, handler, a.Version, string(a.State), t.now.UnixMilli()); err != nil {
			return nil, nil, fmt.Errorf("ack observer delivery: state: %w", err)
		}
	}
	var recent int
	if a.Limits.Quota > 0 {
		if err := t.queryRow(`SELECT COUNT(*) FROM observer_commands WHERE session_id = ? AND created_at > ? AND state <> 'refused'`,
			session, t.now.Add(-a.Limits.Window).UnixMilli()).Scan(&recent); err != nil {
			return nil, nil, fmt.Errorf("ack observer delivery: %w", err)
		}
	}
	for i, c := range a.Commands {
		state, reason := "proposed", ""
		switch {
		case a.Limits.MaxDepth > 0 && depth+1 > a.Limits.MaxDepth:
			state, reason = "refused", fmt.Sprintf("causal depth limit: %s reacted to an effect %d observer commands deep (at most %d)",
				handler, depth, a.Limits.MaxDepth)
		case a.Limits.Quota > 0 && recent >= a.Limits.Quota:
			state, reason = "refused", fmt.Sprintf("command quota: %d observer commands in %s (at most %d)", recent, a.Limits.Window, a.Limits.Quota)
		default:
			recent++
		}
		var result any
		var done any
		if state == "refused" {
			b, _ := json.Marshal(map[string]string{"reason": reason})
			result, done = string(b), t.now.UnixMilli()
		}
		args := a.Commands[i].Args
		if len(args) == 0 {
			args = json.RawMessage(`{}`)
		}
		res, err := t.exec(`INSERT INTO observer_commands (session_id, delivery_id, position, handler, cause_event, depth, op, args, state, result, created_at, done_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			session, a.Delivery, i, handler, eventID, depth+1, c.Op, string(args), state, result, t.now.UnixMilli(), done)
		if err != nil {
			return nil, nil, fmt.Errorf("ack observer delivery: command %d: %w", i, err)
		}
		id, _ := res.LastInsertId()
		if state == "refused" {
			refused = append(refused, reason)
			continue
		}
		minted = append(minted, id)
	}
	if len(refused) > 0 {
		if _, err := t.Notice(session, "hooks.loop_limit", map[string]any{"handler": handler, "event": eventID, "refused": len(refused),
			"message": "observer commands were refused: " + refused[0]}, false); err != nil {
			return nil, nil, err
		}
	}
	t.touch(session)
	return minted, refused, nil
}

// FailObserverDelivery records a failed delivery: it is retried at next, or
// dead-lettered with a notice after maxAttempts. It reports whether it died.
func (t *Tx) FailObserverDelivery(id int64, why string, next time.Time, maxAttempts int) (bool, error) {
	var session, handler string
	var attempts int
	var eventID int64
	if err := t.queryRow(`SELECT session_id, handler, attempts, event_id FROM observer_deliveries WHERE id = ? AND state = 'pending'`, id).
		Scan(&session, &handler, &attempts, &eventID); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return false, fmt.Errorf("%w: %d", ErrDeliverySettled, id)
		}
		return false, err
	}
	attempts++
	if len(why) > 2000 {
		why = why[:2000]
	}
	if attempts >= maxAttempts {
		if _, err := t.exec(`UPDATE observer_deliveries SET state = 'dead', attempts = ?, error = ?, done_at = ? WHERE id = ?`,
			attempts, why, t.now.UnixMilli(), id); err != nil {
			return false, err
		}
		_, err := t.Notice(session, "hooks.dead_letter", map[string]any{"handler": handler, "delivery": id, "event": eventID,
			"attempts": attempts, "error": why,
			"message": fmt.Sprintf("observer %s gave up on event %d after %d attempts: %s", handler, eventID, attempts, why)}, false)
		return true, err
	}
	_, err := t.exec(`UPDATE observer_deliveries SET attempts = ?, error = ?, next_at = ? WHERE id = ?`, attempts, why, next.UnixMilli(), id)
	return false, err
}

// ObserverCommand is a command an observer proposed.
type ObserverCommand struct {
	ID         int64           `json:"id"`
	Session    string          `json:"session"`
	Delivery   int64           `json:"delivery"`
	Handler    string          `json:"handler"`
	CauseEvent int64           `json:"cause_event"`
	Depth      int             `json:"depth"`
	Op         string          `json:"op"`
	Args       json.RawMessage `json:"args"`
	State      string          `json:"state"`
	Result     json.RawMessage `json:"result,omitempty"`
	EffectID   int64           `json:"effect_id,omitempty"`
}

const commandSelect = `SELECT id, session_id, delivery_id, handler, cause_event, depth, op, args, state, COALESCE(result, ''), COALESCE(effect_id, 0) FROM observer_commands`

func scanCommands(rows *sql.Rows) ([]ObserverCommand, error) {
	defer rows.Close()
	var out []ObserverCommand
	for rows.Next() {
		var c ObserverCommand
		var args, result string
		if err := rows.Scan(&c.ID, &c.Session, &c.Delivery, &c.Handler, &c.CauseEvent, &c.Depth, &c.Op, &args, &c.State, &result, &c.EffectID); err != nil {
			return nil, err
		}
		c.Args = json.RawMessage(args)
		if result != "" {
			c.Result = json.RawMessage(result)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// OpenObserverCommands lists session's commands not yet carried out, oldest first.
func (s *Store) OpenObserverCommands(ctx context.Context, session string, limit int) ([]ObserverCommand, error) {
	rows, err := s.rdb.QueryContext(ctx, commandSelect+` WHERE session_id = ? AND state = 'proposed' ORDER BY id LIMIT ?`, session, limit)
	if err != nil {
		return nil, err
	}
	return scanCommands(rows)
}

// ObserverCommands lists session's observer commands, oldest first.
func (s *Store) ObserverCommands(ctx context.Context, session string) ([]ObserverCommand, error) {
	rows, err := s.rdb.QueryContext(ctx, commandSelect+` WHERE session_id = ? ORDER BY id`, session)
	if err != nil {
		return nil, err
	}
	return scanCommands(rows)
}

// FinishObserverCommand records a command carried out (done, with its
// receipt) or refused (with why); effect is its outbox row, if any.
func (t *Tx) FinishObserverCommand(id int64, state string, result any, effect int64) error {
	b, _ := json.Marshal(result)
	var eff any
	if effect != 0 {
		eff = effect
	}
	res, err := t.exec(`UPDATE observer_commands SET state = ?, result = ?, effect_id = ?, done_at = ? WHERE id = ? AND state = 'proposed'`,
		state, string(b), eff, t.now.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("observer command %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: command %d", ErrDeliverySettled, id)
	}
	return nil
}

// ObserverSend is an observer command's local send, reviewed already.
type ObserverSend struct {
	Command  int64
	Session  string
	Handler  string
	Text     string
	Status   string // confirmed or held
	Reason   string
	Epoch    int64
	Release  string
	Fallback bool
	Child    any // the child agent it is sent for (a delegated send), or nil
}

// RecordObserverSend publishes an observer's local send to the speech lane
// (or records it held), its receipt as a delivery.receipt event one level
// deeper, and the command done, in one transaction: carried out once.
func (t *Tx) RecordObserverSend(s ObserverSend) (Receipt, error) {
	var r Receipt
	var depth int
	var cause int64
	if err := t.queryRow(`SELECT depth, cause_event FROM observer_commands WHERE id = ? AND state = 'proposed'`, s.Command).Scan(&depth, &cause); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, fmt.Errorf("%w: command %d", ErrDeliverySettled, s.Command)
		}
		return r, err
	}
	rec := map[string]any{
		"text": s.Text, "status": s.Status, "reason": s.Reason, "observer": s.Handler, "command": s.Command, "cause_event": cause,
		"behavior_epoch": s.Epoch, "release": s.Release, "fallback": s.Fallback,
	}
	if s.Child != nil {
		rec["child"] = s.Child
	}
	content, _ := json.Marshal(rec)
	kind := "local.sent"
	if s.Status == "held" {
		kind = "local.held"
	}
	var err error
	r.EventID, r.Seq, err = t.appendItem(s.Session, kind, LaneSpeech, string(content), t.now, t.now)
	if err != nil {
		return r, fmt.Errorf("observer send: %w", err)
	}
	r.Status, r.Reason, r.Epoch = s.Status, s.Reason, s.Epoch
	receipt := map[string]any{"channel": "local", "state": s.Status, "reason": s.Reason, "event_id": r.EventID,
		"text": s.Text, "observer": s.Handler, "command": s.Command}
	if s.Child != nil {
		receipt["child"] = s.Child
	}
	data, _ := json.Marshal(receipt)
	if _, err := t.exec(`INSERT INTO observer_events (session_id, kind, data, depth, cause_command, created_at) VALUES (?, 'delivery.receipt', ?, ?, ?, ?)`,
		s.Session, string(data), depth, s.Command, t.now.UnixMilli()); err != nil {
		return r, fmt.Errorf("observer send: %w", err)
	}
	return r, t.FinishObserverCommand(s.Command, "done", r, 0)
}

// WakeNow makes session's armed wait due now (an observer's
// runtime.wakeup): the turn loop wakes it by its deadline. It reports
// whether a wait was armed.
func (t *Tx) WakeNow(session string) (bool, error) {
	res, err := t.exec(`UPDATE wakeups SET deadline = ? WHERE session_id = ? AND state = 'armed'`, t.now.UnixMilli(), session)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	if n > 0 {
		t.controlled(session)
	}
	return n > 0, nil
}

// ObserverStat is one binding's diagnostics.
type ObserverStat struct {
	Session     string `json:"session"`
	Handler     string `json:"handler"`
	Release     string `json:"release"`
	Paused      string `json:"paused,omitempty"`
	Backlog     int64  `json:"backlog"` // pending deliveries
	Done        int64  `json:"done"`
	DeadLetters int64  `json:"dead_letters"`
	Commands    int64  `json:"commands"` // minted in all
	Refused     int64  `json:"refused"`  // by the loop limits
	// OldestPending is the age of the oldest pending delivery.
	OldestPending time.Duration `json:"oldest_pending_ns"`
}

// ObserverStats lists every binding's diagnostics.
func (s *Store) ObserverStats(ctx context.Context) ([]ObserverStat, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT b.session_id, b.handler, b.release_id, b.paused,
		(SELECT COUNT(*) FROM observer_deliveries d WHERE d.session_id = b.session_id AND d.handler = b.handler AND d.state = 'pending'),
		(SELECT COUNT(*) FROM observer_deliveries d WHERE d.session_id = b.session_id AND d.handler = b.handler AND d.state = 'done'),
		(SELECT COUNT(*) FROM observer_deliveries d WHERE d.session_id = b.session_id AND d.handler = b.handler AND d.state = 'dead'),
		(SELECT COUNT(*) FROM observer_commands c WHERE c.session_id = b.session_id AND c.handler = b.handler),
		(SELECT COUNT(*) FROM observer_commands c WHERE c.session_id = b.session_id AND c.handler = b.handler AND c.state = 'refused'),
		(SELECT MIN(created_at) FROM observer_deliveries d WHERE d.session_id = b.session_id AND d.handler = b.handler AND d.state = 'pending')
		FROM observer_bindings b ORDER BY b.session_id, b.handler`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ObserverStat
	for rows.Next() {
		var st ObserverStat
		var oldest sql.NullInt64
		if err := rows.Scan(&st.Session, &st.Handler, &st.Release, &st.Paused, &st.Backlog, &st.Done, &st.DeadLetters, &st.Commands, &st.Refused, &oldest); err != nil {
			return nil, err
		}
		if oldest.Valid {
			st.OldestPending = time.Since(time.UnixMilli(oldest.Int64))
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// ObserverEvents lists session's observer events with from <= id <= to
// (to 0: all), oldest first, at most limit: what a replay goes over.
func (s *Store) ObserverEvents(ctx context.Context, session string, kinds []string, from, to int64, limit int) ([]ObserverEvent, error) {
	if to <= 0 {
		to = 1<<62 - 1
	}
	k, _ := json.Marshal(kinds)
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, kind, data, depth, COALESCE(cause_command, 0), created_at FROM observer_events
		WHERE session_id = ? AND id >= ? AND id <= ? AND kind IN (SELECT value FROM json_each(?)) ORDER BY id LIMIT ?`,
		session, from, to, string(k), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ObserverEvent
	for rows.Next() {
		e := ObserverEvent{Session: session}
		var data string
		var at int64
		if err := rows.Scan(&e.ID, &e.Kind, &data, &e.Depth, &e.CauseCommand, &at); err != nil {
			return nil, err
		}
		e.Data, e.At = json.RawMessage(data), time.UnixMilli(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// ObserverBindings lists session's bindings.
func (s *Store) ObserverBindings(ctx context.Context, session string) ([]ObserverBinding, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT handler, release_id, events, cursor, state_version, paused FROM observer_bindings WHERE session_id = ? ORDER BY handler`, session)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ObserverBinding
	for rows.Next() {
		b := ObserverBinding{Session: session}
		var ev string
		if err := rows.Scan(&b.Handler, &b.Release, &ev, &b.Cursor, &b.StateVersion, &b.Paused); err != nil {
			return nil, err
		}
		json.Unmarshal([]byte(ev), &b.Events)
		out = append(out, b)
	}
	return out, rows.Err()
}

// IsDeliverySettled reports an ErrDeliverySettled.
func IsDeliverySettled(err error) bool {
	return err != nil && (errors.Is(err, ErrDeliverySettled) || strings.Contains(err.Error(), "settles once") || strings.Contains(err.Error(), "carried out once"))
}

// unboundPrefix starts the paused reason of a binding the active release
// no longer names.
const unboundPrefix = "unbound: "

// UnbindObservers pauses session's bindings whose handler the active
// release does not name (keep): nothing is delivered to them. Bound again
// later, a handler starts at the newest event, like a new one.
func (t *Tx) UnbindObservers(session, release string, keep []string) error {
	k, _ := json.Marshal(keep)
	_, err := t.exec(`UPDATE observer_bindings SET paused = ? WHERE session_id = ? AND paused NOT LIKE 'unbound: %'
		AND handler NOT IN (SELECT value FROM json_each(?))`,
		fmt.Sprintf("%srelease %.12s does not bind it", unboundPrefix, release), session, string(k))
	return err
}

// LastObserverEvent is the newest observer event's id of session (0: none).
func (s *Store) LastObserverEvent(ctx context.Context, session string) (int64, error) {
	var id int64
	err := s.rdb.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM observer_events WHERE session_id = ?`, session).Scan(&id)
	return id, err
}
