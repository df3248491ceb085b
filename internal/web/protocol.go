package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// The /v2/ws protocol (docs/browser.md). Every message is one JSON object
// in one text frame, with a "type".

// Client → server message types.
const (
	MsgHello = "hello" // first message: {"type":"hello","session":S,"cursor":N,"tail":T?}
	MsgSend  = "send"  // {"type":"send","text":T,"key":K}: an operator input
	MsgDrain = "drain" // {"type":"drain"}: the daemon drains and exits
	MsgStop  = "stop"  // {"type":"stop"}: the daemon interrupts work and exits

	// Operator controls (controls.go): they reach the domain operations
	// directly, never through the model or the hooks.
	MsgReset        = "reset"         // {"type":"reset","session":S?,"kernel":bool?}: a new context epoch, and with kernel a new workbench
	MsgCompact      = "compact"       // {"type":"compact"}: compact the context now (klbr-core compact)
	MsgSessionDrain = "session_drain" // the connected session drains
	MsgSessionStop  = "session_stop"  // the connected session moves to stopped
	MsgSessionPause = "session_pause" // the connected session moves to paused: a running cell or model request is cut off
	MsgSessionStart = "session_start" // the connected session moves to ready
	MsgActivate     = "activate"      // {"type":"activate","release":R,"expected_epoch":E}
	MsgRollback     = "rollback"      // {"type":"rollback"}
	MsgEditSoul     = "edit_soul"     // {"type":"edit_soul","text":T,"expected_epoch":E}: a prompt-only activation
	MsgJobCancel    = "job_cancel"    // {"type":"job_cancel","job":N}: cancel job N, a child agent's too (klbr-core jobs cancel N)
	MsgSpendCap     = "spend_cap"     // {"type":"spend_cap","cap":"daily"|"monthly","usd":X}: set a spend cap (klbr-core spend cap daily X)
)

// CodeCursorPastEnd is the error code of a hello whose cursor is past the session's last
// record; a fresh snapshot follows it.
const CodeCursorPastEnd = "cursor_past_end"

// Server → client message types.
const (
	MsgRecords   = "records"   // {"type":"records","records":[...],"more":bool}
	MsgWindow    = "window"    // {"type":"window","earlier":K,"from":C}: a tail snapshot leaves K earlier records out
	MsgReceipt   = "receipt"   // {"type":"receipt","key":K,"id":N,"event_id":N,"duplicate":bool,"unanswered"?:S}
	MsgAccepted  = "accepted"  // {"type":"accepted","action":"drain"|"stop","message":M}
	MsgError     = "error"     // {"type":"error","code":C,"message":M,"key":K}
	MsgDelta     = "delta"     // {"type":"delta","deltas":[{attempt,step,kind,text?,call?}]}: best-effort, no cursor
	MsgAck       = "ack"       // {"type":"ack","action":A,"session":S,"message":M,"state":{...}?}
	MsgActivated = "activated" // {"type":"activated","action":A,"result":{...}}
)

// Bounds of the protocol.
const (
	// MaxClientFrame bounds one client message: room for the largest
	// admissible body even when JSON escaping doubles it.
	MaxClientFrame = 2*admission.MaxBodyBytes + 1024
	// ReplayPage bounds the records in one records message.
	ReplayPage = 500
	// SnapshotTail is the snapshot a hello whose cursor is past the end gets when it
	// asked for no tail (the page asks for the same on a fresh load).
	SnapshotTail = 2000
	// MaxTail bounds a hello's tail.
	MaxTail = 1 << 20
	// SendQueue bounds the messages queued for one client; a client that
	// lets it fill is disconnected.
	SendQueue = 256
)

// ClientMessage is a decoded client message.
type ClientMessage struct {
	Type    string `json:"type"`
	Session string `json:"session,omitempty"`
	Cursor  int64  `json:"cursor,omitempty"`
	// Tail, in a hello with cursor 0, asks for the session's last Tail
	// records only (a bounded snapshot); 0 replays everything.
	Tail int    `json:"tail,omitempty"`
	Text string `json:"text,omitempty"`
	Key  string `json:"key,omitempty"`
	// Release names a release (an id or a unique id prefix) for activate.
	Release string `json:"release,omitempty"`
	// ExpectedEpoch is the behavior epoch an activation or soul edit is
	// made against (compare-and-swap); required by both.
	ExpectedEpoch *int64 `json:"expected_epoch,omitempty"`
	// Kernel asks a reset to replace the workbench too.
	Kernel bool `json:"kernel,omitempty"`
	// Job names the job of a job_cancel.
	Job int64 `json:"job,omitempty"`
	// Cap and USD are a spend_cap's: which cap (daily or monthly) and its
	// new value in USD.
	Cap string  `json:"cap,omitempty"`
	USD float64 `json:"usd,omitempty"`
}

// MaxCapUSD bounds a spend cap set from the browser (the daemon checks
// [spend]'s own bound as well).
const MaxCapUSD = 1e6

// MaxReleaseRef bounds a release reference.
const MaxReleaseRef = 128

// ErrBadMessage is wrapped by every decode error.
var ErrBadMessage = errors.New("bad client message")

// DecodeClientMessage decodes and checks one client message: one JSON
// object, no unknown fields, no trailing data, fields in bounds.
func DecodeClientMessage(b []byte) (ClientMessage, error) {
	var m ClientMessage
	if len(b) > MaxClientFrame {
		return m, fmt.Errorf("%w: %d bytes, at most %d", ErrBadMessage, len(b), MaxClientFrame)
	}
	if !utf8.Valid(b) {
		return m, fmt.Errorf("%w: not valid UTF-8", ErrBadMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return ClientMessage{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return ClientMessage{}, fmt.Errorf("%w: trailing data after the object", ErrBadMessage)
	}
	bad := func(format string, a ...any) (ClientMessage, error) {
		return ClientMessage{}, fmt.Errorf("%w: %s: %s", ErrBadMessage, m.Type, fmt.Sprintf(format, a...))
	}
	switch m.Type {
	case MsgHello:
		if !session.ValidID(m.Session) {
			return bad("session %q: want 1-64 letters, digits, '-' or '_'", m.Session)
		}
		if m.Cursor < 0 {
			return bad("cursor must be a non-negative integer")
		}
		if m.Tail < 0 || m.Tail > MaxTail {
			return bad("tail must be 0 to %d", MaxTail)
		}
		if m != (ClientMessage{Type: m.Type, Session: m.Session, Cursor: m.Cursor, Tail: m.Tail}) {
			return bad("only session, cursor and tail")
		}
	case MsgSend:
		if m.Text == "" || len(m.Text) > admission.MaxBodyBytes {
			return bad("text must be 1 to %d bytes", admission.MaxBodyBytes)
		}
		if m.Key == "" || len(m.Key) > admission.MaxKeyBytes {
			return bad("key must be 1 to %d bytes", admission.MaxKeyBytes)
		}
		if m != (ClientMessage{Type: m.Type, Text: m.Text, Key: m.Key}) {
			return bad("only text and key")
		}
	case MsgReset:
		if m.Session != "" && !session.ValidID(m.Session) {
			return bad("session %q: want 1-64 letters, digits, '-' or '_'", m.Session)
		}
		if m != (ClientMessage{Type: m.Type, Session: m.Session, Kernel: m.Kernel}) {
			return bad("only session and kernel")
		}
	case MsgCompact:
		if m != (ClientMessage{Type: m.Type}) {
			return bad("compact takes no fields")
		}
	case MsgActivate:
		if m.Release == "" || len(m.Release) > MaxReleaseRef {
			return bad("release must be 1 to %d bytes", MaxReleaseRef)
		}
		if m.ExpectedEpoch == nil || *m.ExpectedEpoch < 0 {
			return bad("expected_epoch must be a non-negative integer")
		}
		if m != (ClientMessage{Type: m.Type, Release: m.Release, ExpectedEpoch: m.ExpectedEpoch}) {
			return bad("only release and expected_epoch")
		}
	case MsgEditSoul:
		if m.Text == "" || len(m.Text) > admission.MaxBodyBytes {
			return bad("text must be 1 to %d bytes", admission.MaxBodyBytes)
		}
		if m.ExpectedEpoch == nil || *m.ExpectedEpoch < 0 {
			return bad("expected_epoch must be a non-negative integer")
		}
		if m != (ClientMessage{Type: m.Type, Text: m.Text, ExpectedEpoch: m.ExpectedEpoch}) {
			return bad("only text and expected_epoch")
		}
	case MsgJobCancel:
		if m.Job <= 0 {
			return bad("job must be a positive job id")
		}
		if m != (ClientMessage{Type: m.Type, Job: m.Job}) {
			return bad("only job")
		}
	case MsgSpendCap:
		if m.Cap != "daily" && m.Cap != "monthly" {
			return bad("cap must be daily or monthly")
		}
		if !(m.USD > 0 && m.USD <= MaxCapUSD) {
			return bad("usd must be more than 0 and at most %g", MaxCapUSD)
		}
		if m != (ClientMessage{Type: m.Type, Cap: m.Cap, USD: m.USD}) {
			return bad("only cap and usd")
		}
	case MsgDrain, MsgStop, MsgSessionDrain, MsgSessionStop, MsgSessionPause, MsgSessionStart, MsgRollback:
		if m != (ClientMessage{Type: m.Type}) {
			return bad("takes no fields")
		}
	case "":
		return ClientMessage{}, fmt.Errorf("%w: no type", ErrBadMessage)
	default:
		return ClientMessage{}, fmt.Errorf("%w: unknown type %q (want hello, send, drain, stop, reset, session_drain, session_stop, session_pause, session_start, activate, rollback, edit_soul, job_cancel or spend_cap)", ErrBadMessage, m.Type)
	}
	return m, nil
}

// windowMsg tells a client its snapshot leaves earlier records out.
type windowMsg struct {
	Type    string `json:"type"`
	Earlier int64  `json:"earlier"` // records before the snapshot
	From    int64  `json:"from"`    // the snapshot's cursor: its records come after it
}

// recordsMsg is a page of records.
type recordsMsg struct {
	Type    string         `json:"type"`
	Records []store.Record `json:"records"`
	More    bool           `json:"more"`
}

type receiptMsg struct {
	Type      string `json:"type"`
	Key       string `json:"key"`
	Session   string `json:"session"`
	ID        int64  `json:"id"`
	EventID   int64  `json:"event_id"`
	Duplicate bool   `json:"duplicate"`
	// Unanswered: why the input will not be answered yet (stopped, paused).
	Unanswered string `json:"unanswered,omitempty"`
}

type acceptedMsg struct {
	Type    string `json:"type"`
	Action  string `json:"action"`
	Message string `json:"message"`
}

type errorMsg struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Key     string `json:"key,omitempty"`
	Action  string `json:"action,omitempty"` // the control refused, for control messages
}

// ackMsg answers a reset or a session control.
type ackMsg struct {
	Type    string         `json:"type"`
	Action  string         `json:"action"`
	Session string         `json:"session"`
	Message string         `json:"message"`
	State   *store.Session `json:"state,omitempty"` // the session after a session control
}

// activatedMsg answers activate, rollback and edit_soul.
type activatedMsg struct {
	Type   string            `json:"type"`
	Action string            `json:"action"`
	Result activation.Result `json:"result"`
}
