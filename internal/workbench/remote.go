package workbench

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// Remote places root sessions' workbenches on a worker host: each
// generation is klbr-workbench-<session>-<generation>.service there, started
// by the host's systemd, its worker protocol over the host's one SSH
// connection. The runtime and the generation's skills travel
// content-addressed (sent once per hash, verified on the host); the model,
// the store and every host request stay here: a remote cell reaches them
// only through klbr-core over the protocol.
type Remote struct {
	Hosts *hosts.Engine
	Host  string
	// Kernel and Python are the host's (looked up on its PATH when not
	// absolute); empty: klbr-kernel and python3.
	Kernel, Python string

	mu    sync.Mutex
	trees map[string]hosts.Tree // packed once per local directory or file

	lostMu sync.Mutex
	lost   map[string]Lost // the last generation lost, by session
}

// Lost is a remote generation that ended unasked: its connection did not
// return within the host's down grace (its kernel there ended it), or the
// unit was stopped on the host; its Python state went with it.
type Lost struct {
	Session    string    `json:"session"`
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`
	Reason     string    `json:"reason"`
}

func (r *Remote) noteLost(session string, gen int64, reason string) {
	r.lostMu.Lock()
	defer r.lostMu.Unlock()
	if r.lost == nil {
		r.lost = map[string]Lost{}
	}
	r.lost[session] = Lost{Session: session, Generation: gen, At: time.Now(), Reason: reason}
}

// remoteLost records that session's remote worker w died between cells:
// a kernel.reset notice with the reason, which the session sees before its
// next cell, and the loss for status. A dropped connection alone does not
// get here: the worker is reattached when it returns (see docs/hosts.md).
func (m *Manager) remoteLost(ctx context.Context, session string, w *worker.Worker) error {
	select {
	case <-w.Exited(): // its last words on the host have been fetched
	case <-time.After(10 * time.Second):
	}
	why := "its worker ended"
	if err := w.Err(); err != nil {
		why = err.Error()
	}
	if d := strings.TrimSpace(w.Diagnostics()); d != "" {
		if len(d) > 500 {
			d = d[len(d)-500:]
		}
		why += "; last output: " + d
	}
	reason := fmt.Sprintf("the workbench on host %s was lost between cells: %s. Its Python state (variables, imports) is gone; "+
		"a new generation starts for the next cell", m.cfg.Remote.Host, strings.ToValidUTF8(why, "?"))
	m.cfg.Remote.noteLost(session, w.Generation(), reason)
	m.cfg.Log.Warn("workbench: the remote worker was lost between cells; a new generation starts", "session", session,
		"host", m.cfg.Remote.Host, "generation", w.Generation(), "why", why)
	return m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.KernelReset(session, w.Generation(), reason) })
}

// RemoteLost lists, by session, the last remote generation that was lost
// unasked (none: nothing was lost, or the workbench runs here).
func (m *Manager) RemoteLost() []Lost {
	if m.cfg.Remote == nil {
		return nil
	}
	r := m.cfg.Remote
	r.lostMu.Lock()
	defer r.lostMu.Unlock()
	out := make([]Lost, 0, len(r.lost))
	for _, l := range r.lost {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lost) int { return strings.Compare(a.Session, b.Session) })
	return out
}

func (m *Manager) remoteFor(session string) bool {
	return m.cfg.Remote != nil && !strings.HasPrefix(session, "child-")
}

// Remote says where root sessions' workbenches run: the host's name, or ""
// for here.
func (m *Manager) RemoteHost() string {
	if m.cfg.Remote == nil {
		return ""
	}
	return m.cfg.Remote.Host
}

// hostPlace is where session works when that is on a worker host (a
// child spawned there); onHost false: here.
func (m *Manager) hostPlace(ctx context.Context, session string) (p workspace.Place, onHost bool, err error) {
	if m.cfg.Workspaces == nil {
		return p, false, nil
	}
	if p, err = m.cfg.Workspaces.For(ctx, session); err != nil {
		return p, false, err
	}
	return p, p.Host != "", nil
}

// remoteOn is the placement of children's workbenches on host, made once.
func (m *Manager) remoteOn(host string) (*Remote, error) {
	if r := m.cfg.Remote; r != nil && r.Host == host {
		return r, nil
	}
	eng := m.cfg.Hosts
	if eng == nil && m.cfg.Remote != nil {
		eng = m.cfg.Remote.Hosts
	}
	if eng == nil {
		return nil, fmt.Errorf("the workbench is on host %s, but klbr.toml defines no [hosts.NAME] any more", host)
	}
	if _, ok := eng.Host(host); !ok {
		return nil, fmt.Errorf("the workbench is on host %s, which klbr.toml no longer defines: define [hosts.%s] again, or cancel the child", host, host)
	}
	m.remoteMu.Lock()
	defer m.remoteMu.Unlock()
	if m.remotes == nil {
		m.remotes = map[string]*Remote{}
	}
	r := m.remotes[host]
	if r == nil {
		r = &Remote{Hosts: eng, Host: host}
		m.remotes[host] = r
	}
	return r, nil
}

// prepare makes spec start on the host: the runtime, the skills file and
// the skill set's directories are put there and every path in spec names
// the host's copy. ws, when set, is the workspace on the host the
// generation works in (a child's copy); else it works in its unit's own
// directory.
func (r *Remote) prepare(ctx context.Context, spec *worker.Spec, runtimeSrc, ws string) error {
	put := func(local string, file, keep bool) (string, error) {
		t, err := r.pack(local, file, keep)
		if err != nil {
			return "", err
		}
		dir, _, err := r.Hosts.PutTree(ctx, r.Host, t)
		if err != nil {
			return "", fmt.Errorf("workbench on host %s: %w", r.Host, err)
		}
		if file {
			return dir + "/" + filepath.Base(local), nil
		}
		return dir, nil
	}
	src, err := put(runtimeSrc, false, true)
	if err != nil {
		return err
	}
	spec.RuntimeSrc = src
	var env []string
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "KLBR_SKILLS_FILE":
			if v, err = put(v, true, false); err != nil {
				return err
			}
		case "PYTHONPATH":
			parts := strings.Split(v, string(os.PathListSeparator))
			for i, p := range parts {
				if parts[i], err = put(p, false, p == runtimeSrc); err != nil {
					return err
				}
			}
			v = strings.Join(parts, string(os.PathListSeparator))
		}
		env = append(env, k+"="+v)
	}
	spec.Env = env
	spec.Kernel, spec.Python = r.Kernel, r.Python
	if spec.Kernel == "" {
		spec.Kernel = "klbr-kernel"
	}
	if spec.Python == "" {
		spec.Python = "python3"
	}
	// The host's own unit is the placement; the workspace is the unit's
	// directory there, or the child's copy.
	spec.Placer, spec.Workspace = nil, ws
	spec.Remote = r.unit(spec.Role, spec.Session, spec.Generation, ws)
	return nil
}

// unit is the unit of a generation on the host: ws, when set, the child's
// copy it works in.
func (r *Remote) unit(role, session string, gen int64, ws string) hosts.WorkerUnit {
	u := hosts.WorkerUnit{Engine: r.Hosts, Host: r.Host, Name: hosts.WorkerUnitName(role, session, gen), Kernel: r.Kernel}
	if u.Kernel == "" {
		u.Kernel = "klbr-kernel"
	}
	if ws != "" {
		u.Workspace = path.Base(ws)
	}
	return u
}

// pack packs a directory, or a file as a tree of that one file; with keep
// (the runtime, which does not change while klbr-core runs) once per
// manager, else (skills, which do change) each time.
func (r *Remote) pack(path string, file, keep bool) (hosts.Tree, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.trees[path]; ok {
		return t, nil
	}
	var t hosts.Tree
	var err error
	if file {
		t, err = hosts.PackFile(path)
	} else {
		t, err = hosts.PackTree(path)
	}
	if err != nil {
		return hosts.Tree{}, err
	}
	if r.trees == nil {
		r.trees = map[string]hosts.Tree{}
	}
	if keep {
		r.trees[path] = t
	}
	return t, nil
}
