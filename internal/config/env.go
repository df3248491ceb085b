package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The environment klbr reads. An empty value counts as unset.
const (
	EnvWorkspace     = "KLBR_WORKSPACE"
	EnvDataDir       = "KLBR_DATA_DIR"
	EnvConfig        = "KLBR_CONFIG"
	EnvControlSocket = "KLBR_CONTROL_SOCKET"
	EnvIngressSocket = "KLBR_INGRESS_SOCKET"
	EnvBehaviorDir   = "KLBR_BEHAVIOR_DIR"
	EnvRuntimeDir    = "KLBR_RUNTIME_DIR"
	EnvSkillsDir     = "KLBR_SKILLS_DIR"
	EnvPython        = "KLBR_PYTHON"
	EnvBindAddr      = "KLBR_BIND_ADDR"
)

// Defaults of the environment.
const (
	DefaultBindAddr = "127.0.0.1:8765"
	DefaultPython   = "python3"
)

// maxSocketPath is the longest path a Unix socket address holds on Linux
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPath = 107

// Paths are the resolved locations the daemon and CLI use. All but Python
// are absolute, or empty where empty has a meaning.
type Paths struct {
	Workspace     string // KLBR_WORKSPACE, default: current directory
	DataDir       string // KLBR_DATA_DIR, default: $STATE_DIRECTORY (its first entry), else $XDG_DATA_HOME/klbr, else $HOME/.local/share/klbr
	ConfigFile    string // KLBR_CONFIG, default <DataDir>/klbr.toml
	ControlSocket string // KLBR_CONTROL_SOCKET, default <DataDir>/control.sock
	IngressSocket string // KLBR_INGRESS_SOCKET, default <DataDir>/ingress.sock
	BehaviorDir   string // KLBR_BEHAVIOR_DIR, default "" (meaning: the embedded tree)
	RuntimeDir    string // KLBR_RUNTIME_DIR, default "" (meaning: the embedded runtime)
	// SkillsDir is KLBR_SKILLS_DIR, default "" (meaning: none). When set,
	// skill ids are also read from it, in the one namespace of the
	// release's and the managed skills, with no more trust than a managed
	// skill. Unset, <workspace>/skills is NOT read: the workspace is the
	// cells' to write, and it would let any write there define skill ids.
	SkillsDir string
	Python    string // KLBR_PYTHON as given, default "python3" (unresolved; see ResolvePython)
}

// resolvePaths reads Paths from the environment through lookup. Relative
// paths are made absolute against the working directory. explicitConfig
// reports whether KLBR_CONFIG named the config file.
func resolvePaths(lookup func(string) (string, bool)) (p Paths, explicitConfig bool, err error) {
	env := func(name string) string {
		v, _ := lookup(name)
		return v
	}
	// abs makes path absolute; what names the variable in errors.
	abs := func(what, path string) string {
		if err != nil || path == "" {
			return path
		}
		var a string
		if a, err = filepath.Abs(path); err != nil {
			err = fmt.Errorf("%s: %w", what, err)
		}
		return a
	}
	orDefault := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}

	workspace := env(EnvWorkspace)
	if workspace == "" {
		if workspace, err = os.Getwd(); err != nil {
			return Paths{}, false, fmt.Errorf("workspace: set %s: %w", EnvWorkspace, err)
		}
	}
	p.Workspace = abs(EnvWorkspace, workspace)

	dataDir := env(EnvDataDir)
	if dataDir == "" {
		if dataDir, err = defaultDataDir(env); err != nil {
			return Paths{}, false, err
		}
	}
	p.DataDir = abs(EnvDataDir, dataDir)

	explicitConfig = env(EnvConfig) != ""
	p.ConfigFile = abs(EnvConfig, orDefault(env(EnvConfig), filepath.Join(p.DataDir, "klbr.toml")))
	p.ControlSocket = abs(EnvControlSocket, orDefault(env(EnvControlSocket), filepath.Join(p.DataDir, "control.sock")))
	p.IngressSocket = abs(EnvIngressSocket, orDefault(env(EnvIngressSocket), filepath.Join(p.DataDir, "ingress.sock")))
	p.BehaviorDir = abs(EnvBehaviorDir, env(EnvBehaviorDir))
	p.RuntimeDir = abs(EnvRuntimeDir, env(EnvRuntimeDir))
	p.SkillsDir = abs(EnvSkillsDir, env(EnvSkillsDir))
	p.Python = orDefault(env(EnvPython), DefaultPython)
	if err != nil {
		return Paths{}, false, err
	}

	if err := checkSockets(p); err != nil {
		return Paths{}, false, err
	}
	return p, explicitConfig, nil
}

// defaultDataDir picks the data directory when KLBR_DATA_DIR is unset:
// systemd's StateDirectory=, else the XDG data directory.
func defaultDataDir(env func(string) string) (string, error) {
	if state, _, _ := strings.Cut(env("STATE_DIRECTORY"), ":"); state != "" {
		return state, nil
	}
	// The XDG base directory spec says to ignore a relative XDG_DATA_HOME.
	if xdg := env("XDG_DATA_HOME"); filepath.IsAbs(xdg) {
		return filepath.Join(xdg, "klbr"), nil
	}
	if home := env("HOME"); home != "" {
		return filepath.Join(home, ".local", "share", "klbr"), nil
	}
	return "", errors.New("data directory: neither STATE_DIRECTORY, XDG_DATA_HOME nor HOME is set: set " + EnvDataDir)
}

// checkSockets refuses socket paths a Unix socket cannot bind, so that the
// error names the variable to set instead of surfacing later as EINVAL.
func checkSockets(p Paths) error {
	for _, s := range []struct{ env, path string }{
		{EnvControlSocket, p.ControlSocket},
		{EnvIngressSocket, p.IngressSocket},
	} {
		if len(s.path) > maxSocketPath {
			return fmt.Errorf("socket path %s is %d bytes, more than the %d a Unix socket address holds: set %s (or %s) to a shorter path",
				s.path, len(s.path), maxSocketPath, s.env, EnvDataDir)
		}
	}
	if p.ControlSocket == p.IngressSocket {
		return fmt.Errorf("%s and %s are the same path %s: the two sockets must differ", EnvControlSocket, EnvIngressSocket, p.ControlSocket)
	}
	return nil
}
