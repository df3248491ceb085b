package agents

import (
	"context"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// checkHostWorkspace refuses a spawn on a host whose workspace is not a
// copy of its own: a host cannot reach the spawner's directory, so a
// shared or read-only workspace cannot be honoured there.
func checkHostWorkspace(args spawnArgs) error {
	if args.Host == "" || args.Workspace == "" || args.Workspace == store.WorkspaceWorktree {
		return nil
	}
	return invalid("agents.spawn: workspace %q with host=%q: a child on a host works on a copy of your workspace there "+
		"(workspace=\"worktree\", the default with host=), and its changes come back to you as a patch", args.Workspace, args.Host)
}

// placeOnHost makes a child's place on the host sel names ("NAME", or
// "label:L": the host with the label that is up with the most room): a
// copy of parent's directory there. A host that cannot be reached now
// refuses the spawn, and says what to do; nothing of it is stored.
func (a *Agents) placeOnHost(ctx context.Context, session string, parent workspace.Place, sel string) (*store.ChildWorkspace, bool, error) {
	ws := a.cfg.Workspaces
	refused := func(format string, v ...any) error {
		return &worker.RequestError{Code: "refused", Message: "agents.spawn: " + fmt.Sprintf(format, v...)}
	}
	if ws.Hosts == nil {
		return nil, false, refused("host=%q, but klbr.toml defines no [hosts.NAME]: define one (docs/hosts.md), or spawn without host=", sel)
	}
	if parent.Host != "" {
		return nil, false, refused("this session works in a copy on host %s; a copy of a copy is not made: its children share it there "+
			"(spawn without host=), or spawn the child from a session that works here", parent.Host)
	}
	host, release, err := ws.Hosts.Reserve(sel)
	if err != nil {
		return nil, false, refused("host=%q: %v", sel, err)
	}
	release() // a child's workbench takes no job slot; the pick is all
	p, err := ws.MakeOnHost(ctx, parent, host, session)
	if err != nil {
		return nil, false, refused("the child cannot work on host %s now: %v; nothing was spawned: spawn it again when the host answers "+
			"(klbr-core hosts says how it is), on another host, or without host=", host, err)
	}
	return &p, true, nil
}

// patchTimeout bounds bringing a child's changes back from its host.
const patchTimeout = 5 * time.Minute

// hostPatch brings the changes of session, a child working on a host,
// back as a patch artifact before its end is committed, and says so for
// its parent's notice. A child that works here gets nothing; a patch that
// cannot be made is said, and the copy stays on the host.
func (a *Agents) hostPatch(ctx context.Context, session string) (workspace.Patch, string) {
	ws := a.cfg.Workspaces
	if ws == nil {
		return workspace.Patch{}, ""
	}
	j, err := a.cfg.Store.ChildJobOf(ctx, session)
	if err != nil || j.State != store.JobRunning {
		return workspace.Patch{}, ""
	}
	spec, err := store.ChildSpecOf(j)
	if err != nil || spec.Workspace == nil || spec.Workspace.Host == "" || spec.Workspace.Mode != store.WorkspaceWorktree {
		return workspace.Patch{}, ""
	}
	w := spec.Workspace
	// Not cut off by the caller (a cancel's end is recorded however it
	// was asked), but bounded: a host that stops answering costs the end
	// its patch, not the end itself.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), patchTimeout)
	defer cancel()
	p, err := ws.Patch(pctx, *w)
	switch {
	case err != nil:
		if a.cfg.Log != nil {
			a.cfg.Log.Warn("a child's changes on its host were not brought back", "job", j.ID, "host", w.Host, "error", err)
		}
		return p, fmt.Sprintf("\nIts changes on host %s could not be brought back (%v); they stay in %s there until `await agents.remove_workspace(%d)`.",
			w.Host, err, w.Dir, j.ID)
	case p.Ref == "":
		return p, fmt.Sprintf("\nIt changed nothing in its copy of your workspace on host %s.", w.Host)
	}
	return p, fmt.Sprintf("\nIts changes on host %s are patch %s (%d files, %d bytes; git diff format, paths relative to %s): "+
		"read it with `await history.read(%q)`, and apply it with `git apply` in your workspace, or not. Nothing was applied.",
		w.Host, p.Ref, p.Files, p.Size, w.Root, p.Ref)
}

// hostPatchNote is a child's patch and what its parent's notice says of it.
type hostPatchNote struct {
	patch workspace.Patch
	note  string
}

// maxPatchedBelow bounds the descendants looked at for patches before a
// subtree is cancelled (the tree's own cap, agents.max_descendants, is
// at most 10000).
const maxPatchedBelow = 10000

// hostPatchesBelow brings back, before they are cancelled with session,
// the changes of its running descendants that work on a host, by session:
// their parents are told of their patches as of any child's.
func (a *Agents) hostPatchesBelow(ctx context.Context, session string) map[string]hostPatchNote {
	if a.cfg.Workspaces == nil || a.cfg.Workspaces.Hosts == nil {
		return nil
	}
	out := map[string]hostPatchNote{}
	queue, seen := []string{session}, 0
	for len(queue) > 0 && seen < maxPatchedBelow {
		parent := queue[0]
		queue = queue[1:]
		kids, err := a.cfg.Store.Jobs(ctx, store.JobFilter{Session: parent, Kind: "child", State: store.JobRunning, Limit: maxPatchedBelow})
		if err != nil {
			return out
		}
		for _, k := range kids {
			seen++
			spec, err := store.ChildSpecOf(k)
			if err != nil {
				continue
			}
			queue = append(queue, spec.Session)
			if spec.Workspace != nil && spec.Workspace.Host != "" {
				if p, note := a.hostPatch(ctx, spec.Session); note != "" {
					out[spec.Session] = hostPatchNote{p, note}
				}
			}
		}
	}
	return out
}
