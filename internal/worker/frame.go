package worker

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// ProtocolVersion is the worker protocol version this host speaks.
const ProtocolVersion = 1

// MaxFrameBytes bounds one frame's JSON payload (klbr-kernel's --listen
// bridge carries frames whole up to the same bound).
const MaxFrameBytes = kernel.MaxProtocolFrame

// ErrProtocol marks every malformed frame. The stream is abandoned after it.
var ErrProtocol = errors.New("worker protocol error")

// Frame types (docs/worker-protocol.md).
const (
	TypeHello      = "hello"
	TypeExecute    = "execute"
	TypeInterrupt  = "interrupt"
	TypeHostReply  = "host_reply"
	TypeHookInvoke = "hook_invoke"
	TypeShutdown   = "shutdown"
	TypeReattach   = "reattach"
	TypeOutput     = "output"
	TypeRequest    = "host_request"
	TypeOutcome    = "outcome"
	TypeHookResult = "hook_result"
)

// Frame is one protocol message. Fields not used by a type are left empty.
type Frame struct {
	V          int    `json:"v"`
	Type       string `json:"type"`
	Session    string `json:"session"`
	Generation int64  `json:"generation"`

	// hello
	Role           string `json:"role,omitempty"`
	PID            int    `json:"pid,omitempty"`
	Python         string `json:"python,omitempty"`
	SDK            string `json:"sdk,omitempty"`
	Protocol       int    `json:"protocol,omitempty"`
	SkillsRevision string `json:"skills_revision,omitempty"`

	// execute, interrupt, output, host_request, host_reply, outcome
	Execution string `json:"execution,omitempty"`
	Code      string `json:"code,omitempty"`

	// output
	Stream string `json:"stream,omitempty"`
	Data   string `json:"data,omitempty"`
	Origin string `json:"origin,omitempty"`
	Task   string `json:"task,omitempty"`

	// host_request, host_reply
	Request int64           `json:"request,omitempty"`
	Op      string          `json:"op,omitempty"`
	Args    json.RawMessage `json:"args,omitempty"`
	OK      *bool           `json:"ok,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *ErrorInfo      `json:"error,omitempty"`

	// outcome
	Status         string          `json:"status,omitempty"`
	Value          *string         `json:"value,omitempty"`
	ValueTruncated bool            `json:"value_truncated,omitempty"`
	Yield          json.RawMessage `json:"yield,omitempty"`

	// hook_invoke, hook_result
	Invocation string          `json:"invocation,omitempty"`
	Slot       string          `json:"slot,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// ErrorInfo describes a failure: a Python exception (type, message,
// traceback) or a host refusal (code, message).
type ErrorInfo struct {
	Type      string `json:"type,omitempty"`
	Code      string `json:"code,omitempty"`
	Message   string `json:"message"`
	Traceback string `json:"traceback,omitempty"`
}

// ReadFrame reads one frame. Any malformed input is an ErrProtocol with a
// diagnostic; io.EOF is returned only at a clean frame boundary.
func ReadFrame(r io.Reader) (*Frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: stream ended inside a frame header", ErrProtocol)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrameBytes {
		return nil, fmt.Errorf("%w: frame length %d is outside 1..%d", ErrProtocol, n, MaxFrameBytes)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("%w: stream ended inside a %d-byte frame", ErrProtocol, n)
	}
	return DecodeFrame(buf)
}

// DecodeFrame parses one frame's payload.
func DecodeFrame(payload []byte) (*Frame, error) {
	if !utf8.Valid(payload) {
		return nil, fmt.Errorf("%w: frame is not valid UTF-8", ErrProtocol)
	}
	trimmed := bytes.TrimLeft(payload, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%w: frame is not a JSON object", ErrProtocol)
	}
	var f Frame
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: malformed JSON: %v", ErrProtocol, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrProtocol)
	}
	if f.Type == "" {
		return nil, fmt.Errorf("%w: frame has no type", ErrProtocol)
	}
	return &f, nil
}

// WriteFrame encodes f and writes it as one frame.
func WriteFrame(w io.Writer, f *Frame) error {
	payload, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if len(payload) > MaxFrameBytes {
		return fmt.Errorf("%w: frame of %d bytes is over the bound", ErrProtocol, len(payload))
	}
	buf := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	copy(buf[4:], payload)
	_, err = w.Write(buf)
	return err
}
