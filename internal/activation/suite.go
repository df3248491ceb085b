package activation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/klbr-dev/klbr/internal/worker"
)

// The host suite (klbr_runtime.validate) and how its report is trusted.
//
// The suite has to import the candidate's modules, and code that runs in a
// process owns that process: it can print, write every descriptor it finds
// in /proc/self/fd, patch the suite's functions, read any secret the
// process holds, or end it. So no verdict may come from a process that runs
// candidate code. The suite is a supervisor that never imports the
// candidate: it starts one probe per module (a fresh interpreter that
// imports that module alone and answers on a pipe of its own) and judges
// each probe from outside: an early exit, a kill, a second answer or an
// answer about another module fails that module's check. A module can at
// most decide its own check, which it could equally pass by importing
// cleanly; it cannot vouch for another module or for the report.
//
// Here the host accepts the supervisor's report only when
//   - the supervisor exited 0 within its deadline (a killed or stopped
//     supervisor is a refusal);
//   - its stdout is exactly one line, the report: a report written by
//     anything else (a probe that found a way to the supervisor's stdout) is
//     a second line, and a refusal. The supervisor closes every inherited
//     descriptor in each probe before the candidate's code runs, and makes
//     itself (and so its probes) non-dumpable, so a probe of the sandbox's
//     uid cannot open its descriptors under /proc or trace it; stopping it
//     from writing its own report takes killing it, which the exit status
//     shows. (No nonce: the probes are forked from the supervisor, so they
//     would hold any secret it held, and the rules here need none.);
//   - its checks are exactly the ones the host expects, each once: the host
//     enumerates the modules of klbr_hooks and klbr_skills and the skills
//     itself (expectedChecks), so a missing check is a refusal.
// The slots the report names are then checked by the host itself against
// the candidate's hook worker (fixtures, [hooks], replay).

// suiteReport is what klbr_runtime.validate prints.
type suiteReport struct {
	OK       bool     `json:"ok"`
	Slots    []string `json:"slots"`
	Attempts []string `json:"attempts"`
	Checks   []Check  `json:"checks"`
}

// parseSuite decodes the suite's report: its whole output, one line,
// bounded in size and in counts.
func parseSuite(out []byte) (suiteReport, error) {
	var r suiteReport
	if len(out) > maxSuiteOutput {
		return r, fmt.Errorf("the suite's output is over %d bytes", maxSuiteOutput)
	}
	line, rest, found := bytes.Cut(out, []byte("\n"))
	if !found || len(rest) > 0 {
		return r, errors.New("the suite's output is not exactly one report line (something else wrote to it)")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("the suite's report does not decode: %v", err)
	}
	if dec.More() {
		return r, errors.New("the suite's report has trailing data")
	}
	if len(r.Checks) > maxSuiteChecks || len(r.Slots) > maxSuiteSlots || len(r.Attempts) > maxSuiteChecks {
		return r, errors.New("the suite's report is over its bounds")
	}
	for i := range r.Checks {
		r.Checks[i].Name = cut(r.Checks[i].Name, 200)
		r.Checks[i].Detail = cut(r.Checks[i].Detail, maxCheckDetail)
	}
	for i := range r.Attempts {
		r.Attempts[i] = cut(r.Attempts[i], 200)
	}
	return r, nil
}

// expectedChecks names every check the suite must report for the release
// tree at dir, as klbr_runtime.validate enumerates them (_modules, _skills):
// "import M" for each module of klbr_hooks and klbr_skills, klbr_hooks.SLOTS,
// and skills/<id>/SKILL.md for each skill directory. The host reads the tree
// itself (a published release: host-written, regular files only) through
// an os.Root.
func expectedChecks(dir string) (map[string]bool, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("expected checks: %w", err)
	}
	defer root.Close()
	fsys := root.FS()
	want := map[string]bool{"klbr_hooks.SLOTS": true}
	for _, pkg := range []string{"klbr_hooks", "klbr_skills"} {
		if fi, err := fs.Stat(fsys, pkg); err != nil || !fi.IsDir() {
			continue
		}
		err := fs.WalkDir(fsys, pkg, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != pkg && (d.Name() == "__pycache__" || strings.HasPrefix(d.Name(), ".")) {
					return fs.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(d.Name(), ".py") {
				return nil
			}
			mod := strings.ReplaceAll(path.Dir(p), "/", ".")
			if d.Name() != "__init__.py" {
				mod += "." + strings.TrimSuffix(d.Name(), ".py")
			}
			want["import "+mod] = true
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("expected checks: %w", err)
		}
	}
	if skills, err := fs.ReadDir(fsys, "skills"); err == nil {
		for _, e := range skills {
			if e.IsDir() {
				want["skills/"+e.Name()+"/SKILL.md"] = true
			}
		}
	}
	return want, nil
}

// checkComplete is nil when checks holds each expected check exactly once
// and nothing else.
func checkComplete(want map[string]bool, checks []Check) error {
	seen := make(map[string]bool, len(checks))
	for _, c := range checks {
		switch {
		case seen[c.Name]:
			return fmt.Errorf("the suite reported %q twice", c.Name)
		case !want[c.Name]:
			return fmt.Errorf("the suite reported %q, a check the host does not expect", c.Name)
		}
		seen[c.Name] = true
	}
	var missing []string
	for name := range want {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("the suite did not report %s", strings.Join(missing, ", "))
	}
	return nil
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// commandSeq numbers the validation's contained commands (the suite, the
// candidate's tests): one sequence, so two running side by side never share
// a placement, far above the workbench's own command numbers.
var commandSeq atomic.Int64

func nextCommand() int64 { return 1<<40 + commandSeq.Add(1) }

// runSuite runs the host suite on release's tree in a fresh, contained
// process with fake effects, and accepts its report only as the comment at
// the top of this file says. Its dependencies (site) are given to the probes
// only: -P and PYTHONSAFEPATH keep the tree (its working directory) off the
// supervisor's path, so a release cannot ship a klbr_runtime of its own.
func (s *Service) runSuite(ctx context.Context, session, release, site string) (suiteReport, error) {
	cfg := s.hooks.Config()
	tree := s.releases.Tree(release)
	want, err := expectedChecks(tree)
	if err != nil {
		return suiteReport{}, fmt.Errorf("the host suite could not run: %v", err)
	}
	argv := []string{cfg.Python, "-s", "-P", "-m", "klbr_runtime.validate"}
	if site != "" {
		argv = append(argv, "--site", site)
	}
	res, err := worker.RunCommand(ctx, worker.CommandSpec{
		Kernel: cfg.Kernel, Placer: cfg.Placer, Limits: cfg.Limits, Sandbox: cfg.Sandbox, Session: session, Seq: nextCommand(),
		Argv: append(argv, tree), Dir: tree,
		Env:     map[string]string{"PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1", "PYTHONPATH": cfg.RuntimeSrc},
		Timeout: SuiteTimeout, MaxOutput: maxSuiteOutput,
	})
	if err != nil {
		return suiteReport{}, fmt.Errorf("the host suite could not run: %v", err)
	}
	tail := string(res.Stderr)
	if len(tail) > 1000 {
		tail = "…" + tail[len(tail)-1000:]
	}
	switch {
	case res.Cancelled:
		return suiteReport{}, fmt.Errorf("the host suite was cancelled: %v", context.Cause(ctx))
	case res.TimedOut:
		return suiteReport{}, fmt.Errorf("the host suite did not finish within %s", SuiteTimeout)
	case res.ExitCode != 0:
		return suiteReport{}, fmt.Errorf("the host suite exited with code %d (killed or ended early, so it did not judge the candidate); %s", res.ExitCode, tail)
	}
	r, err := parseSuite(res.Stdout)
	if err == nil {
		err = checkComplete(want, r.Checks)
	}
	if err != nil {
		return suiteReport{}, fmt.Errorf("the host suite did not report: %v; %s", err, tail)
	}
	return r, nil
}
