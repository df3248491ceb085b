package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The oldest Python klbr's runtime supports.
const (
	MinPythonMajor = 3
	MinPythonMinor = 11
)

// ErrPythonTooOld is wrapped by ResolvePython's error for an interpreter
// older than MinPythonMajor.MinPythonMinor.
var ErrPythonTooOld = errors.New("python is too old")

// pythonProbeTimeout bounds each interpreter run of ResolvePython.
const pythonProbeTimeout = 10 * time.Second

// maxProbeOutput bounds what ResolvePython keeps of an interpreter's output.
const maxProbeOutput = 4096

// ResolvePython turns KLBR_PYTHON (a name looked up on PATH, or a path) into
// the interpreter binary workers run, once, so that a version manager's shim
// does not run (and fork) for every worker. When the file found is a script
// (it starts with "#!", as pyenv's shims do), it is asked for
// sys.executable; the result then has its symlinks resolved, except inside
// a virtual environment, whose interpreter must keep its path to find the
// environment's pyvenv.cfg. It also reports the interpreter's version and
// refuses one older than 3.11 with an error wrapping ErrPythonTooOld (bin
// and version are still returned then, for doctor to show). Each run of the
// interpreter is bounded by a 10 s timeout within ctx.
func ResolvePython(ctx context.Context, name string) (bin string, version string, err error) {
	if name == "" {
		return "", "", fmt.Errorf("resolve python: no interpreter named: set %s", EnvPython)
	}
	found, err := exec.LookPath(name)
	if err != nil {
		return "", "", fmt.Errorf("resolve python %q: %w; set %s to a Python ≥ %d.%d interpreter",
			name, err, EnvPython, MinPythonMajor, MinPythonMinor)
	}
	if bin, err = filepath.Abs(found); err != nil {
		return "", "", fmt.Errorf("resolve python %q: %w", name, err)
	}

	script, err := isScript(bin)
	if err != nil {
		return "", "", fmt.Errorf("resolve python %q: %w", name, err)
	}
	if script {
		out, err := runPython(ctx, bin, "import sys; print(sys.executable)")
		if err != nil {
			return "", "", fmt.Errorf("resolve python %q: ask the script %s for its interpreter: %w", name, bin, err)
		}
		if !filepath.IsAbs(out) {
			return "", "", fmt.Errorf("resolve python %q: the script %s reports sys.executable %q, not an absolute path", name, bin, out)
		}
		bin = out
	}
	if !inVirtualEnv(bin) {
		if bin, err = filepath.EvalSymlinks(bin); err != nil {
			return "", "", fmt.Errorf("resolve python %q: %w", name, err)
		}
	}

	version, err = runPython(ctx, bin, "import sys; print('%d.%d.%d' % sys.version_info[:3])")
	if err != nil {
		return "", "", fmt.Errorf("resolve python %q: ask %s for its version: %w", name, bin, err)
	}
	major, minor, ok := parseVersion(version)
	if !ok {
		return "", "", fmt.Errorf("resolve python %q: %s reports version %q, not major.minor.patch", name, bin, version)
	}
	if major < MinPythonMajor || major == MinPythonMajor && minor < MinPythonMinor {
		return bin, version, fmt.Errorf("resolve python %q: %s is Python %s; klbr needs ≥ %d.%d: set %s to a newer interpreter: %w",
			name, bin, version, MinPythonMajor, MinPythonMinor, EnvPython, ErrPythonTooOld)
	}
	return bin, version, nil
}

// isScript reports whether the file at path starts with "#!".
func isScript(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	return string(magic[:]) == "#!", nil
}

// inVirtualEnv reports whether the interpreter at path belongs to a virtual
// environment: Python looks for pyvenv.cfg beside its executable or one
// directory up, by the path it was started with.
func inVirtualEnv(path string) bool {
	dir := filepath.Dir(path)
	for _, cfg := range []string{filepath.Join(dir, "pyvenv.cfg"), filepath.Join(filepath.Dir(dir), "pyvenv.cfg")} {
		if _, err := os.Stat(cfg); err == nil {
			return true
		}
	}
	return false
}

// runPython runs bin -c code and returns the last line it printed.
func runPython(ctx context.Context, bin, code string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, pythonProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-c", code)
	// A script (a shim) may start children of its own: run it in its own
	// process group and kill the group on timeout, so that nothing is left
	// behind, and do not wait on pipes a straggler still holds.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var stdout, stderr capBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if msg := lastLine(stderr.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, msg)
		}
		return "", err
	}
	return lastLine(stdout.String()), nil
}

// lastLine returns the last non-blank line of s, trimmed.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	return s
}

// parseVersion parses "major.minor.patch".
func parseVersion(v string) (major, minor int, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return 0, 0, false
		}
		n[i] = x
	}
	return n[0], n[1], true
}

// capBuffer keeps the first maxProbeOutput bytes written to it and drops
// the rest, so that a chatty interpreter cannot grow it without bound.
type capBuffer struct {
	buf bytes.Buffer
}

// Write keeps what fits and reports all of p written, so that the child
// never blocks on it.
func (c *capBuffer) Write(p []byte) (int, error) {
	if room := maxProbeOutput - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String returns what was kept.
func (c *capBuffer) String() string { return c.buf.String() }
