package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/delivery"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/metrics"
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
		Observe: func(slot, outcome string, latency time.Duration) { m.HookInvocation(slot, outcome, latency) },
	})
	d.behavior = activation.New(d.store, rel, d.hooks, d.bench, d.log.With("component", "activation"))
	ops := activation.NewOps(d.behavior, filepath.Join(cfg.Paths.DataDir, "drafts"))
	if sb := wb.Sandbox; sb.DropUser {
		ops.WithOwner(sb.UID, sb.GID)
	}
	d.bench.SetOps("behavior.", ops)
	d.bench.SetOps("hooks.", ops)
	d.bench.SetOps("local.", delivery.NewLocal(d.store, d.hooks))
	d.bench.SetOps("discord.", ingress.NewOps(d.store, d.hooks, d.ingress))
	d.bench.SetSkills(d.skillsFor(cfg.Paths.DataDir, rel))
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

// skillsFor reads a session's skills when a workbench generation starts:
// builtin ones from its active release, managed ones from <data>/skills (an
// id in both is refused), written once per revision under <data>/runtime.
func (d *daemon) skillsFor(dataDir string, rel *behavior.Releases) workbench.SkillsFunc {
	return func(ctx context.Context, session string) (behavior.SkillSet, string, error) {
		sess, err := d.store.Session(ctx, session)
		if err != nil {
			return behavior.SkillSet{}, "", err
		}
		var roots []behavior.SkillRoot
		if sess.PolicyRevision != "" {
			roots = append(roots, behavior.SkillRoot{Name: "builtin", Dir: filepath.Join(rel.Tree(sess.PolicyRevision), "skills")})
		}
		roots = append(roots, behavior.SkillRoot{Name: "managed", Dir: filepath.Join(dataDir, "skills")})
		set, err := behavior.LoadSkills(roots)
		if err != nil {
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
