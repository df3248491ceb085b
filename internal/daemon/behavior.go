package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/code"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/delivery"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/pyenv"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// behaviorSource is the tree published as the default release: the
// embedded one, or KLBR_BEHAVIOR_DIR for development.
func behaviorSource(paths config.Paths) (fs.FS, string) {
	if paths.BehaviorDir != "" {
		return os.DirFS(paths.BehaviorDir), paths.BehaviorDir
	}
	return behaviortree.Tree(), "embedded"
}

// bootBehavior publishes the default behavior tree, starts the hook
// dispatcher, and gives every session its behavior: the default release for
// a new session, the last good release where the active one is corrupt.
func (d *daemon) bootBehavior(ctx context.Context, cfg *config.Config, m *metrics.Metrics) error {
	rel, err := behavior.Open(filepath.Join(cfg.Paths.DataDir, "releases"))
	if err != nil {
		return err
	}
	src, from := behaviorSource(cfg.Paths)
	man, err := rel.Publish(src)
	if err != nil {
		return fmt.Errorf("publish the default behavior tree (%s): %w", from, err)
	}
	wb := d.bench.Config()
	d.releases = rel
	d.hooks = hooks.New(hooks.Config{
		Store: d.store, Releases: rel, Kernel: wb.Kernel, Python: wb.Python, RuntimeSrc: wb.RuntimeSrc,
		Workspace: wb.Workspace, Placer: wb.Placer, Limits: wb.Limits, Sandbox: wb.Sandbox, Log: d.log.With("component", "hooks"),
		Observe:     func(slot, outcome string, latency time.Duration) { m.HookInvocation(slot, outcome, latency) },
		WorkerEvent: func(e string) { m.WorkerEvent("hooks", e) },
		Workspaces:  wb.Workspaces,
	})
	d.behavior = activation.New(d.store, rel, d.hooks, d.bench, d.log.With("component", "activation"))
	d.envs = pyenv.Envs{Root: filepath.Join(cfg.Paths.DataDir, "runtime", "envs"), Wheels: filepath.Join(cfg.Paths.DataDir, "wheels"), Python: wb.Python}
	d.behavior.SetEnvironments(d.envs)
	ops := activation.NewOps(d.behavior, filepath.Join(cfg.Paths.DataDir, "drafts"))
	if sb := wb.Sandbox; sb.DropUser {
		ops.WithOwner(sb.UID, sb.GID)
	}
	d.bench.SetOps("behavior.", ops)
	d.bench.SetOps("hooks.", ops)
	// A child agent speaks on these only where its spawn delegated them.
	d.bench.SetOps("local.", agents.Guard(d.store, delivery.NewLocal(d.store, d.hooks)))
	dops := ingress.NewOps(d.store, d.hooks, d.ingress)
	dops.Workspace = func(ctx context.Context, session string) (string, error) { // a send's files are read beneath it
		// A cell on a worker host names files in the host's copy: the
		// host's klbr-kernel reads them there, never klbr-core's own.
		if hd, onHost, err := d.bench.HostDirOf(ctx, session); err != nil || onHost {
			if err != nil {
				return "", err
			}
			return "", &ingress.RemoteWorkspaceError{Host: hd.Host, Read: hd.Read}
		}
		p, err := wb.Workspaces.For(ctx, session)
		return p.Dir, err
	}
	d.bench.SetOps("discord.", agents.Guard(d.store, dops))
	d.bench.SetSkills(d.skillsFor(cfg.Paths, rel))
	svc := d.behavior
	d.bench.SetCrashed(func(session string, pin store.Pin, reason string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := svc.WorkerCrashed(ctx, session, pin.Epoch, pin.Release, "workbench", reason); err != nil {
			d.log.Error("crash loop check", "session", session, "error", err)
		}
	})
	d.logSkills(man.ID)
	d.bench.SetOps("code.", code.NewOps(rel, behaviortree.Tree()))
	d.bench.SetPresent(presentResult(d.hooks))
	if err := d.behavior.Publish(ctx, man); err != nil {
		return err
	}
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return err
	}
	for _, s := range sessions {
		res, err := d.behavior.Boot(ctx, s.ID, man.ID)
		if err != nil {
			// The session stays on whatever it had; cells still run, and
			// reviews hold until an operator activates a good release.
			d.log.Error("behavior: session has no usable release", "session", s.ID, "error", err)
			continue
		}
		d.log.Info("behavior", "session", s.ID, "epoch", res.Epoch, "release", res.Release, "kind", res.Kind)
	}
	return nil
}

// skillRoots are where a release's skills are read from: its own skills/
// and klbr_skills/, the operator's KLBR_SKILLS_DIR when set, then the
// managed skills of <data>/skills.
func skillRoots(paths config.Paths, rel *behavior.Releases, release string) []behavior.SkillRoot {
	tree := ""
	if release != "" {
		tree = rel.Tree(release)
	}
	return behavior.SkillRoots(tree, paths.SkillsDir, paths.DataDir)
}

// skillIndex is the bounded skill index of the contract message of a
// session running release: what its next workbench generation is offered.
// It is read again only when the release or the managed skills changed
// (their directory entries' names, sizes and times): one stat walk per
// model request.
func (d *daemon) skillIndex(release string) string {
	managed := filepath.Join(d.cfg.Paths.DataDir, "skills")
	key := release + "\x00" + treeSignature(managed) + "\x00" + treeSignature(d.cfg.Paths.SkillsDir)
	d.indexMu.Lock()
	defer d.indexMu.Unlock()
	if d.indexKey == key {
		return d.index
	}
	set, err := behavior.LoadSkills(skillRoots(d.cfg.Paths, d.releases, release))
	if err != nil {
		return "## Skill index\n\n(the skills could not be read: " + err.Error() + ")"
	}
	d.indexKey, d.index = key, set.Index()
	return d.index
}

// treeSignature is the names, sizes and modification times of what lies
// under dir, two levels deep (skills/<id>/<file>).
func treeSignature(dir string) string {
	var b strings.Builder
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %d %d\n", e.Name(), fi.Size(), fi.ModTime().UnixNano())
		if !e.IsDir() {
			continue
		}
		sub, _ := os.ReadDir(filepath.Join(dir, e.Name()))
		for _, f := range sub {
			if fi, err := f.Info(); err == nil {
				fmt.Fprintf(&b, " %s %d %d\n", f.Name(), fi.Size(), fi.ModTime().UnixNano())
			}
		}
	}
	return b.String()
}

// maintenanceSkill is the body of the maintenance skill offered with
// release, which a maintenance turn carries.
func (d *daemon) maintenanceSkill(_ context.Context, release string) (string, error) {
	set, err := behavior.LoadSkills(skillRoots(d.cfg.Paths, d.releases, release))
	if err != nil {
		return "", err
	}
	body, ok := set.Skills["maintenance"]
	if !ok {
		if why := set.Refused["maintenance"]; why != "" {
			return "", fmt.Errorf("the maintenance skill is refused: %s", why)
		}
		return "", fmt.Errorf("no maintenance skill is offered")
	}
	return body, nil
}

// logSkills logs the skill index of the default release at start: the ids
// offered, the modules and the refusals.
func (d *daemon) logSkills(release string) {
	set, err := behavior.LoadSkills(skillRoots(d.cfg.Paths, d.releases, release))
	if err != nil {
		d.log.Error("skills cannot be read", "error", err)
		return
	}
	ids := make([]string, 0, len(set.Skills))
	for id := range set.Skills {
		ids = append(ids, id)
	}
	mods := make([]string, 0, len(set.Modules))
	for m := range set.Modules {
		mods = append(mods, "klbr_skills."+m)
	}
	sort.Strings(ids)
	sort.Strings(mods)
	d.log.Info("skills", "release", release, "ids", strings.Join(ids, ","), "modules", strings.Join(mods, ","), "revision", set.Revision)
	for id, why := range set.Refused {
		d.log.Warn("skill refused", "id", id, "reason", why)
	}
}

// skillsFor reads a session's skills when a workbench generation starts:
// builtin ones from its active release, managed ones from <data>/skills (an
// id in both is refused), written once per revision under <data>/runtime.
func (d *daemon) skillsFor(paths config.Paths, rel *behavior.Releases) workbench.SkillsFunc {
	dataDir := paths.DataDir
	return func(ctx context.Context, session, release string) (behavior.SkillSet, string, error) {
		if release == "" {
			sess, err := d.store.Session(ctx, session)
			if err != nil {
				return behavior.SkillSet{}, "", err
			}
			release = sess.PolicyRevision
		}
		set, err := behavior.LoadSkills(skillRoots(paths, rel, release))
		if err != nil {
			return set, "", err
		}
		// The release's own environment: staged before its activation,
		// never resolved here.
		reqs, err := pyenv.Declared(rel.Tree(release))
		if err != nil {
			return set, "", err
		}
		if set.Site, err = d.envs.Path(reqs); err != nil {
			return set, "", err
		}
		if err != nil {
			return set, "", err
		}
		// The klbr_skills package this generation imports: staged once per
		// revision, read-only, so it cannot change under the generation.
		if set.Path, err = behavior.Stage(set, filepath.Join(dataDir, "runtime", "skillpkg")); err != nil {
			return set, "", err
		}
		dir := filepath.Join(dataDir, "runtime", "skills")
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return set, "", err
		}
		file := filepath.Join(dir, set.Revision+".json")
		if _, err := os.Stat(file); err == nil {
			return set, file, nil
		}
		b, _ := json.Marshal(set)
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil { // read by workers, maybe of another uid
			return set, "", err
		}
		return set, file, os.Rename(tmp, file)
	}
}

// presentResult is result.present over the host's rendering of an outcome.
func presentResult(h *hooks.Dispatcher) workbench.PresentFunc {
	return func(ctx context.Context, session string, pin store.Pin, out *worker.Outcome) (string, bool) {
		text := turn.RenderOutcome(*out)
		got := h.PresentResultAt(context.WithoutCancel(ctx), session, &pin, hooks.PresentInput{Session: session, Status: out.Status, Text: text})
		return got, got != text
	}
}
