package kernel

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Exit statuses of klbr-kernel besides the child's own.
const (
	ExitDeadline  = 124 // the --deadline fired
	ExitKernel    = 125 // the kernel failed: bad usage, not placed, a system call refused
	ExitNotPlaced = 125 // the go-ahead pipe was closed without a byte
	ExitCannotRun = 126 // ARGV exists but could not be executed
	ExitNotFound  = 127 // ARGV was not found
	// ExitNoListener (--attach): no kernel listens on the socket (it has not started yet,
	// or it has ended).
	ExitNoListener = 69
)

// Config is what the command line says.
type Config struct {
	ProtocolFD int // -1: none
	// ProtocolStdio carries the protocol over the kernel's own stdin and stdout (a worker
	// on another host, whose only channel is an SSH session): the child reads it from fd
	// 3, the kernel's stdin, and writes it to fd 4, the kernel's stdout. The child's
	// stdout goes to the kernel's stderr.
	ProtocolStdio bool
	// Listen carries the protocol over connections to a Unix socket at this path, one at
	// a time, as a stream that survives their drops (internal/resume); with no connection
	// for Grace the tree is killed. The child's stdout goes to the kernel's stderr.
	Listen    string
	Grace     time.Duration
	GoAheadFD int           // -1: none
	Deadline  time.Duration // 0: none
	KeepEnv   []string      // extra variable names to pass through
	Argv      []string      // the child's argv, at least one element
	// RlimitAS and RlimitNproc (0: none) are set as hard limits on the child, not on the
	// kernel: placement's rlimit mode passes them (placement.Placer.KernelArgs).
	RlimitAS    int64
	RlimitNproc int64
	// Sandbox is taken away from the child before exec (--deny, --ro, --rw, --uid, --gid).
	Sandbox Sandbox
}

// ParseArgs parses the kernel's arguments (without the program name).
func ParseArgs(args []string) (Config, error) {
	cfg := Config{ProtocolFD: -1, GoAheadFD: -1}
	uid, gid := -1, -1
	fs := flag.NewFlagSet("klbr-kernel", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&cfg.ProtocolFD, "protocol-fd", -1, "inherited fd of the protocol socket; the child gets it as fd 3")
	fs.BoolVar(&cfg.ProtocolStdio, "protocol-stdio", false, "carry the protocol over stdin/stdout; the child reads it from fd 3 and writes it to fd 4")
	fs.Func("listen", "carry the protocol over connections to a Unix socket at this path (resumable); the child gets a socket as fd 3", func(s string) error {
		if !strings.HasPrefix(s, "/") {
			return fmt.Errorf("%q is not an absolute path", s)
		}
		cfg.Listen = s
		return nil
	})
	fs.DurationVar(&cfg.Grace, "grace", 2*time.Minute, "with --listen: end the generation after this long without a connection")
	fs.IntVar(&cfg.GoAheadFD, "go-ahead-fd", -1, "inherited fd to read one go-ahead byte from before starting")
	fs.DurationVar(&cfg.Deadline, "deadline", 0, "kill the tree this long after the child started (0: never)")
	fs.Int64Var(&cfg.RlimitAS, "rlimit-as", 0, "RLIMIT_AS (bytes) for the child (0: none)")
	fs.Int64Var(&cfg.RlimitNproc, "rlimit-nproc", 0, "RLIMIT_NPROC for the child (0: none)")
	path := func(dst *[]string) func(string) error {
		return func(s string) error {
			if !strings.HasPrefix(s, "/") {
				return fmt.Errorf("%q is not an absolute path", s)
			}
			*dst = append(*dst, s)
			return nil
		}
	}
	fs.Func("deny", "the child may not reach anything beneath this path (repeatable; Landlock)", path(&cfg.Sandbox.Deny))
	fs.Func("ro", "the child may read beneath this path although it is beneath a denied one (repeatable)", path(&cfg.Sandbox.ReadOnly))
	fs.Func("rw", "the child may write beneath this path (repeatable)", path(&cfg.Sandbox.ReadWrite))
	fs.IntVar(&uid, "uid", -1, "run the child as this uid, without capabilities (root only)")
	fs.IntVar(&gid, "gid", -1, "run the child with this gid and no supplementary groups (root only)")
	fs.Func("tmp", "the child's TMPDIR, writable", func(s string) error {
		if !strings.HasPrefix(s, "/") {
			return fmt.Errorf("%q is not an absolute path", s)
		}
		cfg.Sandbox.TempDir = s
		return nil
	})
	fs.BoolVar(&cfg.Sandbox.DropCaps, "drop-caps", false, "run the child without any capability, even as root")
	fs.Func("keep-env", "pass this environment variable through as well (repeatable)", func(s string) error {
		if s == "" || strings.ContainsAny(s, "=\x00") {
			return fmt.Errorf("invalid variable name %q", s)
		}
		cfg.KeepEnv = append(cfg.KeepEnv, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("usage: %w", err)
	}
	// flag stops at "--" (consumed) or at the first non-flag argument; demand the "--" so
	// that an ARGV starting with a dash is never taken for a kernel flag.
	consumed := len(args) - fs.NArg()
	if consumed == 0 || args[consumed-1] != "--" {
		return Config{}, errors.New("usage: klbr-kernel [flags] -- ARGV...")
	}
	cfg.Argv = fs.Args()
	if len(cfg.Argv) == 0 || cfg.Argv[0] == "" {
		return Config{}, errors.New("usage: no command after --")
	}
	if cfg.ProtocolFD != -1 && cfg.ProtocolFD < 3 {
		return Config{}, fmt.Errorf("usage: --protocol-fd %d: must be 3 or above", cfg.ProtocolFD)
	}
	if cfg.ProtocolStdio && cfg.ProtocolFD != -1 {
		return Config{}, errors.New("usage: --protocol-stdio and --protocol-fd exclude each other")
	}
	if cfg.Listen != "" && (cfg.ProtocolStdio || cfg.ProtocolFD != -1) {
		return Config{}, errors.New("usage: --listen excludes --protocol-stdio and --protocol-fd")
	}
	if cfg.Grace <= 0 {
		return Config{}, fmt.Errorf("usage: --grace %s: must be positive", cfg.Grace)
	}
	if cfg.GoAheadFD != -1 && cfg.GoAheadFD < 3 {
		return Config{}, fmt.Errorf("usage: --go-ahead-fd %d: must be 3 or above", cfg.GoAheadFD)
	}
	if cfg.ProtocolFD != -1 && cfg.ProtocolFD == cfg.GoAheadFD {
		return Config{}, errors.New("usage: --protocol-fd and --go-ahead-fd name the same fd")
	}
	if cfg.RlimitAS < 0 || cfg.RlimitNproc < 0 {
		return Config{}, errors.New("usage: negative --rlimit-as or --rlimit-nproc")
	}
	if (uid < 0) != (gid < 0) {
		return Config{}, errors.New("usage: --uid and --gid go together")
	}
	if uid >= 0 {
		cfg.Sandbox.DropUser, cfg.Sandbox.UID, cfg.Sandbox.GID = true, uid, gid
	}
	if cfg.Deadline < 0 {
		return Config{}, fmt.Errorf("usage: --deadline %s: negative", cfg.Deadline)
	}
	return cfg, nil
}
