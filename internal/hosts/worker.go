package hosts

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// WorkerUnit runs one generation of a session's worker (klbr-kernel
// --protocol-stdio) on a host as klbr-<role>-<session>-<generation>.service,
// its protocol stream over the host's connection. It is what
// worker.Spec.Remote takes.
type WorkerUnit struct {
	Engine *Engine
	Host   string
	Name   string // the unit's name: WorkerUnitName
	// Workspace, when set, is the workspace on the host the worker works
	// in (MakeWorkspace's name): a child agent's copy.
	Workspace string
	// Kernel is klbr-kernel on the host (looked up on the login's PATH when
	// not absolute): Attach runs it.
	Kernel string
}

// DefaultWorkerGrace is how long a worker's kernel waits for a connection
// when the host sets no down_grace_seconds.
const DefaultWorkerGrace = 2 * time.Minute

func (u WorkerUnit) unit(argv, env []string) Unit {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return Unit{Name: u.Name, Description: "klbr worker " + u.Name, Argv: argv, Env: m, Confine: true, Workspace: u.Workspace}
}

// Serve starts the unit as a service whose kernel listens on its protocol
// socket (worker.Resumable).
func (u WorkerUnit) Serve(ctx context.Context, argv, env []string) error {
	return u.Engine.Serve(ctx, u.Host, u.unit(argv, env))
}

// Attach is one connection to the unit's protocol socket (worker.Resumable).
func (u WorkerUnit) Attach(ctx context.Context) (*exec.Cmd, error) {
	k := u.Kernel
	if k == "" {
		k = "klbr-kernel"
	}
	return u.Engine.Attach(ctx, u.Host, u.Name, k)
}

// Forward is one connection to the unit's protocol socket forwarded by the
// host's connection itself, with no relay process (worker.Forwarder); nil
// and no error when it cannot be forwarded to (ErrNoForward): Attach
// reaches it.
func (u WorkerUnit) Forward(ctx context.Context) (net.Conn, error) {
	c, err := u.Engine.Forward(ctx, u.Host, u.Name)
	if errors.Is(err, ErrNoForward) {
		return nil, nil
	}
	return c, err
}

// Grace is how long the unit's kernel waits for a connection: the host's
// down_grace_seconds, or DefaultWorkerGrace.
func (u WorkerUnit) Grace() time.Duration {
	if h, ok := u.Engine.Host(u.Host); ok && h.DownGrace > 0 {
		return h.DownGrace
	}
	return DefaultWorkerGrace
}

// WorkerUnitName is the unit of a worker generation. A session name that is
// not plain lower-case letters, digits and dashes is spelled in hex.
func WorkerUnitName(role, session string, generation int64) string {
	if !plainName.MatchString(session) {
		session = "x" + fmt.Sprintf("%x", session)
	}
	return fmt.Sprintf("klbr-%s-%s-%d.service", role, session, generation)
}

var plainName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// Command is the SSH session that starts the unit with argv and env, its
// stdin and stdout the unit's.
func (u WorkerUnit) Command(ctx context.Context, argv, env []string) (*exec.Cmd, error) {
	return u.Engine.Pipe(ctx, u.Host, u.unit(argv, env))
}

// Tail returns the last n bytes of the unit's output on the host (its
// kernel's and Python's stderr): a dead worker's last words
// (worker.Tailer).
func (u WorkerUnit) Tail(ctx context.Context, n int) ([]byte, error) {
	return u.Engine.Tail(ctx, u.Host, u.Name, n)
}

// Stop stops the unit and removes its directory on the host.
func (u WorkerUnit) Stop(ctx context.Context) error {
	return u.Engine.Collect(ctx, u.Host, u.Name)
}
