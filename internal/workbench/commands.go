package workbench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/worker"
)

// commands answers a cell's host requests that need no model.
type commands struct {
	m       *Manager
	b       *bench
	session string
	// yielded is set once the cell's runtime.wait was accepted: the wait is
	// terminal, so the execution's later requests are refused.
	yielded atomic.Bool
}

// MaxWaitSeconds bounds runtime.wait's seconds; longer waits belong to
// durable schedules.
const MaxWaitSeconds = 600

// RunArgs are workspace.run's arguments.
type RunArgs struct {
	Argv    []string          `json:"argv"`
	Cwd     string            `json:"cwd"`
	Env     map[string]string `json:"env"`
	Timeout float64           `json:"timeout"`
}

// Bounds of workspace.run.
const (
	MaxRunTimeout = time.Hour
	MaxRunOutput  = 1 << 20
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c *commands) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	if c.yielded.Load() {
		return nil, &worker.RequestError{Code: "yielded", Message: r.Op + " refused: this cell already waited (runtime.wait is a terminal yield)"}
	}
	switch r.Op {
	case "workspace.run":
		return c.run(ctx, r.Args)
	case "runtime.wait":
		return c.wait(r.Args)
	default:
		ops, _ := c.m.ext()
		if prefix, _, ok := strings.Cut(r.Op, "."); ok {
			if h := ops[prefix+"."]; h != nil {
				return c.traced(ctx, h, r)
			}
		}
		return nil, &worker.RequestError{Code: "unsupported", Message: fmt.Sprintf("%s is not served here yet", r.Op)}
	}
}

// wait accepts a terminal wait: seconds in (0, 600] or null, a short
// reason. The turn loop commits it when the cell has ended.
func (c *commands) wait(raw json.RawMessage) (json.RawMessage, error) {
	var a struct {
		Seconds *float64 `json:"seconds"`
		Reason  string   `json:"reason"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, invalid("runtime.wait: %v", err)
	}
	if s := a.Seconds; s != nil && (math.IsNaN(*s) || math.IsInf(*s, 0) || *s <= 0 || *s > MaxWaitSeconds) {
		return nil, invalid("runtime.wait: seconds must be None or 0 < seconds <= %d, not %v", MaxWaitSeconds, *s)
	}
	if len(a.Reason) > 1000 || !utf8.ValidString(a.Reason) {
		return nil, invalid("runtime.wait: reason must be valid UTF-8 of at most 1000 bytes")
	}
	c.yielded.Store(true)
	return json.RawMessage(`{"accepted":true}`), nil
}

func invalid(format string, a ...any) error {
	return &worker.RequestError{Code: "invalid", Message: fmt.Sprintf(format, a...)}
}

func (c *commands) run(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	var a RunArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, invalid("workspace.run: %v", err)
	}
	if len(a.Argv) == 0 || a.Argv[0] == "" {
		return nil, invalid("workspace.run: argv must name a program")
	}
	for k := range a.Env {
		if !envName.MatchString(k) {
			return nil, invalid("workspace.run: %q is not an environment variable name", k)
		}
	}
	timeout := time.Duration(a.Timeout * float64(time.Second))
	if a.Timeout == 0 {
		timeout = 60 * time.Second
	}
	if timeout <= 0 || timeout > MaxRunTimeout {
		return nil, invalid("workspace.run: timeout must be between 0 and %s", MaxRunTimeout)
	}
	root, sb, err := c.m.Place(ctx, c.session)
	if err != nil {
		return nil, &worker.RequestError{Code: "failed", Message: "workspace.run: " + err.Error()}
	}
	dir, err := Bind(root, a.Cwd)
	if err != nil {
		return nil, invalid("workspace.run: %v", err)
	}
	c.b.commands++
	res, err := worker.RunCommand(ctx, worker.CommandSpec{
		Kernel: c.m.cfg.Kernel, Placer: c.m.cfg.Placer, Limits: c.m.cfg.Limits, Sandbox: sb,
		Session: c.session, Seq: c.b.commands, Argv: a.Argv, Dir: dir, Env: a.Env,
		Timeout: timeout, MaxOutput: MaxRunOutput,
	})
	if err != nil {
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	return json.Marshal(map[string]any{
		"exit_code": res.ExitCode, "truncated": res.Truncated, "timed_out": res.TimedOut, "cancelled": res.Cancelled,
		"stdout_b64": base64.StdEncoding.EncodeToString(res.Stdout),
		"stderr_b64": base64.StdEncoding.EncodeToString(res.Stderr),
	})
}

// Bind resolves rel against the workspace root and refuses anything that
// leaves it, through ".." or through a symlink.
func Bind(root, rel string) (string, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", root, err)
	}
	if filepath.IsAbs(rel) {
		return "", errors.New("paths are relative to the workspace")
	}
	p, err := filepath.EvalSymlinks(filepath.Join(realRoot, rel))
	if err != nil {
		return "", err
	}
	if p != realRoot && !strings.HasPrefix(p, realRoot+string(os.PathSeparator)) {
		return "", fmt.Errorf("%q leaves the workspace", rel)
	}
	return p, nil
}

type sessionKey struct{}

// WithSession tells a delegated request handler whose cell asked.
func WithSession(ctx context.Context, session string) context.Context {
	return context.WithValue(ctx, sessionKey{}, session)
}

// SessionFrom returns the session WithSession recorded.
func SessionFrom(ctx context.Context) string {
	s, _ := ctx.Value(sessionKey{}).(string)
	return s
}

type pinKey struct{}

func withPin(ctx context.Context, p store.Pin) context.Context {
	return context.WithValue(ctx, pinKey{}, p)
}

// PinFrom returns the behavior the asking cell was accepted under.
func PinFrom(ctx context.Context) (store.Pin, bool) {
	p, ok := ctx.Value(pinKey{}).(store.Pin)
	return p, ok
}

type callKey struct{}

// Call names the model step and tool call a cell runs for, and the
// attention frame the step's attempt runs under (0: none).
type Call struct {
	Step  int64
	ID    string
	Frame int64
}

// WithCall marks the cells run under ctx as the answer to a tool call: the
// cell's outcome answers the call in the same commit.
func WithCall(ctx context.Context, c Call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// CallFrom returns the tool call the asking cell answers, if any.
func CallFrom(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callKey{}).(Call)
	return c, ok
}

// cellCall is the store's view of the tool call ctx carries, if any.
func cellCall(ctx context.Context) *store.ToolCall {
	c, ok := CallFrom(ctx)
	if !ok {
		return nil
	}
	return &store.ToolCall{Step: c.Step, ID: c.ID}
}

// traced serves a host request under a span of the cell's trace (none when
// tracing is off): each send and its receipt, each job and child dispatch.
// A spawned child's traces link to the spawn's span.
func (c *commands) traced(ctx context.Context, h worker.Handler, r worker.Request) (json.RawMessage, error) {
	ctx = WithSession(ctx, c.session)
	if tracing.From(ctx) == nil {
		return h.HandleRequest(ctx, r)
	}
	ctx, span := tracing.Start(ctx, "klbr.host "+r.Op, tracing.Options{Attrs: []tracing.Attr{
		tracing.String("klbr.op", r.Op), tracing.String("klbr.session", c.session)}})
	res, err := h.HandleRequest(ctx, r)
	if err == nil && span.Recording() {
		// A receipt's ids and state, never its text: a send's (status,
		// event_id), a job's or child's (id, state).
		var receipt struct {
			ID      int64  `json:"id"`
			EventID int64  `json:"event_id"`
			State   string `json:"state"`
			Status  string `json:"status"`
		}
		if json.Unmarshal(res, &receipt) == nil {
			for k, v := range map[string]int64{"klbr.receipt.id": receipt.ID, "klbr.receipt.event_id": receipt.EventID} {
				if v != 0 {
					span.Set(tracing.Int(k, v))
				}
			}
			for k, v := range map[string]string{"klbr.receipt.state": receipt.State, "klbr.receipt.status": receipt.Status} {
				if v != "" {
					span.Set(tracing.String(k, clipState(v)))
				}
			}
			if r.Op == "agents.spawn" && receipt.ID != 0 {
				// The handler remembered this span for the child's links
				// before it started the child (agents.spawn).
				span.Set(tracing.String("klbr.child.session", store.ChildSessionID(receipt.ID)))
			}
		}
	}
	span.End(err)
	return res, err
}

// clipState keeps a receipt's state a short label, whatever a handler said.
func clipState(s string) string {
	if len(s) > 32 {
		return s[:32]
	}
	return s
}
