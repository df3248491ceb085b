// Package doctor checks an installation: configuration, paths, the SQLite
// runtime, the data directory and its lock, the operator token and Python.
// Each failed check says what to do.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/sandbox"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Check is one finding.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Warn   bool   `json:"warn,omitempty"` // OK, but worth a look
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // what to do when not OK, or about a warning
}

// Report is every finding, and the resolved paths.
type Report struct {
	OK     bool               `json:"ok"`
	Paths  *config.Paths      `json:"paths,omitempty"`
	SQLite *store.RuntimeInfo `json:"sqlite,omitempty"`
	Checks []Check            `json:"checks"`
}

// Options are what Run checks beyond the environment.
type Options struct {
	// InForce asks the daemon serving the data directory what it runs;
	// nil InForce and no error: none serves. nil: not asked.
	InForce func(context.Context) (*InForce, error)
	// Verbose keeps the long details: the sandbox's paragraph.
	Verbose bool
}

// Run checks the installation described by the environment lookup.
func Run(ctx context.Context, lookup func(string) (string, bool), opts Options) Report {
	var r Report
	add := func(c Check) { r.Checks = append(r.Checks, c) }

	cfg, err := config.Load(lookup)
	loadErr := err
	if err != nil {
		add(Check{Name: "config", Detail: err.Error(), Fix: "correct the file or variable named above"})
		// The other checks still run, on the paths alone and the defaults.
		if paths, perr := config.LoadPaths(lookup); perr == nil {
			cfg = &config.Config{Paths: paths, File: config.Defaults()}
			r.Paths = &cfg.Paths
		}
	} else {
		r.Paths = &cfg.Paths
		detail := "no config file (defaults apply): " + cfg.Paths.ConfigFile
		if cfg.FileLoaded {
			detail = "loaded " + cfg.Paths.ConfigFile
		}
		add(Check{Name: "config", OK: true, Detail: detail})
		add(Check{Name: "bind", OK: true, Detail: cfg.BindAddr + " (loopback)"})
		checkRoutes(ctx, cfg, lookup, add)
		add(checkSpend(&cfg.File))
	}
	var loaded *config.Config
	if loadErr == nil {
		loaded = cfg
	}
	checkInForce(ctx, opts.InForce, loaded, loadErr, add)

	info, err := store.ReadRuntimeInfo(ctx)
	switch {
	case err != nil:
		add(Check{Name: "sqlite", Detail: err.Error(), Fix: "rebuild klbr-core with cgo enabled"})
	default:
		r.SQLite = &info
		if err := store.CheckSQLiteVersion(info.Version); err != nil {
			add(Check{Name: "sqlite", Detail: err.Error(), Fix: "rebuild klbr-core without the libsqlite3 build tag, so it uses the bundled SQLite"})
		} else {
			add(Check{Name: "sqlite", OK: true, Detail: fmt.Sprintf("%s (WAL-reset fix present; %d compile options)", info.Version, len(info.CompileOptions))})
		}
	}

	if cfg != nil {
		checkDataDir(ctx, cfg.Paths.DataDir, add)
		checkSkills(cfg.Paths, add)
		checkReleaseSkills(ctx, cfg.Paths, add)
		checkProfiles(cfg, add)
		checkHosts(ctx, cfg, add)
		if k, err := worker.FindKernel(); err != nil {
			add(Check{Name: "kernel", Detail: err.Error(), Fix: "build it beside klbr-core (make build)"})
		} else {
			add(Check{Name: "kernel", OK: true, Detail: k})
		}
		if p, err := placement.Detect(ctx, placement.Options{SystemdBus: os.Getenv("KLBR_SYSTEMD_BUS")}); err != nil {
			add(Check{Name: "placement", Detail: err.Error(), Fix: "run as a user that can create cgroups, or under systemd"})
		} else {
			detail := string(p.Mode())
			for _, sk := range p.Skipped() {
				detail += "; skipped " + sk.String()
			}
			add(Check{Name: "placement", OK: true, Detail: detail})
			p.Close()
		}
		bin, ver, err := config.ResolvePython(ctx, cfg.Paths.Python)
		if err != nil {
			add(Check{Name: "python", Detail: err.Error(), Fix: "install Python 3.11 or newer, or point KLBR_PYTHON at one"})
		} else {
			add(Check{Name: "python", OK: true, Detail: fmt.Sprintf("%s (%s)", bin, ver)})
			checkRuntime(ctx, cfg.Paths, bin, add)
			// What a cell runs without here. A weaker sandbox is reported, not a failure:
			// klbr runs, and the line says what does not hold.
			sb, note := sandbox.ForWorkers(cfg, bin, "")
			detail := sandbox.Brief(sb, note)
			if opts.Verbose {
				detail = sandbox.Describe(sb, note)
			}
			add(Check{Name: "sandbox", OK: true, Detail: detail})
		}
	}
	r.OK = true
	for _, c := range r.Checks {
		r.OK = r.OK && c.OK
	}
	return r
}

func checkDataDir(ctx context.Context, dir string, add func(Check)) {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !setup.Initialized(dir)) {
		add(Check{Name: "data", Detail: dir + " is not initialized", Fix: "run `klbr-core init` (make run does it for you)"})
		return
	}
	if err != nil {
		add(Check{Name: "data", Detail: err.Error(), Fix: "check the permissions of KLBR_DATA_DIR"})
		return
	}
	if fi.Mode().Perm()&0o077 != 0 {
		add(Check{Name: "data", Detail: fmt.Sprintf("%s is open to others (mode %v)", dir, fi.Mode().Perm()), Fix: "chmod 700 " + dir})
	} else {
		add(Check{Name: "data", OK: true, Detail: dir})
	}
	held, owner, err := store.Holder(ctx, dir)
	switch {
	case err != nil:
		add(Check{Name: "lock", Detail: err.Error(), Fix: "check the permissions of " + dir})
	case held && owner != nil:
		add(Check{Name: "lock", OK: true, Detail: "held by klbr-core " + owner.String()})
	case held:
		add(Check{Name: "lock", OK: true, Detail: "held by a process that has not recorded itself yet"})
	default:
		add(Check{Name: "lock", OK: true, Detail: "free (no daemon is serving this directory)"})
	}
	checkSchema(ctx, dir, add)
	if _, err := setup.ReadToken(setup.TokenFile(dir)); err != nil {
		add(Check{Name: "token", Detail: err.Error(), Fix: "run `klbr-core init` to create the operator token, or chmod 600 it"})
	} else {
		add(Check{Name: "token", OK: true, Detail: setup.TokenFile(dir) + " (private)"})
	}
}

// String renders the report for a terminal.
func (r Report) String() string { return r.Text(false) }

// Text renders the report for a terminal; verbose adds SQLite's compile
// options.
func (r Report) Text(verbose bool) string {
	var b strings.Builder
	if r.Paths != nil {
		p := r.Paths
		fmt.Fprintf(&b, "paths:\n  data      %s\n  config    %s\n  control   %s\n  ingress   %s\n  workspace %s\n  skills    builtin: the active release's skills/; managed: %s\n",
			p.DataDir, p.ConfigFile, p.ControlSocket, p.IngressSocket, p.Workspace, filepath.Join(p.DataDir, "skills"))
		fmt.Fprintf(&b, "  behavior  %s\n  runtime   %s\n\n", orEmbedded(p.BehaviorDir), orEmbedded(p.RuntimeDir))
	}
	for _, c := range r.Checks {
		mark := "ok  "
		switch {
		case !c.OK:
			mark = "FAIL"
		case c.Warn:
			mark = "WARN"
		}
		fmt.Fprintf(&b, "%s %-7s %s\n", mark, c.Name, c.Detail)
		if (!c.OK || c.Warn) && c.Fix != "" {
			fmt.Fprintf(&b, "             → %s\n", c.Fix)
		}
	}
	if r.SQLite != nil && verbose {
		fmt.Fprintf(&b, "\nsqlite compile options: %s\n", strings.Join(r.SQLite.CompileOptions, " "))
	}
	return b.String()
}

func orEmbedded(p string) string {
	if p == "" {
		return "(embedded)"
	}
	return p
}

// checkSchema reports the database's schema version against this binary's,
// whether a downgrade of the binary is possible, and the WAL's size.
func checkSchema(ctx context.Context, dir string, add func(Check)) {
	r, err := store.OpenReader(ctx, dir)
	if err != nil {
		add(Check{Name: "schema", Detail: err.Error(), Fix: "check the permissions of " + dir})
		return
	}
	defer r.Close()
	sc, err := r.Schema(ctx)
	if err != nil {
		add(Check{Name: "schema", Detail: err.Error(), Fix: "run `klbr-core check`"})
		return
	}
	down := "no downgrade: an older klbr-core refuses this file (restore a backup taken before the upgrade to go back)"
	if sc.Downgrade {
		down = fmt.Sprintf("a klbr-core of schema %d can still run on it", sc.ReadableBy)
	}
	switch {
	case sc.Version > sc.Binary && sc.ReadableBy > sc.Binary:
		add(Check{Name: "schema", Detail: fmt.Sprintf("the database is at schema %d, this klbr-core knows %d and the file is not readable by it", sc.Version, sc.Binary),
			Fix: "run the newer klbr-core that wrote it, or restore a backup"})
	case sc.Version > sc.Binary:
		add(Check{Name: "schema", OK: true, Detail: fmt.Sprintf("the database is at schema %d, newer than this klbr-core (%d), which may still run on it (a rolled-back binary)", sc.Version, sc.Binary)})
	case sc.Version < sc.Binary:
		add(Check{Name: "schema", OK: true, Detail: fmt.Sprintf("the database is at schema %d; this klbr-core migrates it to %d when it starts (back it up first: klbr-core backup)", sc.Version, sc.Binary)})
	default:
		add(Check{Name: "schema", OK: true, Detail: fmt.Sprintf("schema %d; %s", sc.Version, down)})
	}
	if sz := r.Sizes(); sz.WAL > store.WALBoundBytes {
		add(Check{Name: "wal", OK: true, Detail: fmt.Sprintf("the WAL is %d MiB, past its bound of %d MiB: a long reader (a backup?) holds it; it shrinks once klbr-core is idle", sz.WAL>>20, store.WALBoundBytes>>20)})
	}
}
