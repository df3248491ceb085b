package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// trees packs the directories that travel to hosts for routines (the
// runtime, releases' trees), once each: neither changes under a path.
type trees struct {
	mu sync.Mutex
	m  map[string]hosts.Tree
}

// maxPackedTrees bounds the trees kept packed; past it the cache starts over.
const maxPackedTrees = 8

func (t *trees) pack(dir string) (hosts.Tree, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.m[dir]; ok {
		return tr, nil
	}
	tr, err := hosts.PackTree(dir)
	if err != nil {
		return hosts.Tree{}, err
	}
	if t.m == nil || len(t.m) >= maxPackedTrees {
		t.m = map[string]hosts.Tree{}
	}
	t.m[dir] = tr
	return tr, nil
}

// errDeferred says the run was put back to pending (its host was not
// ready); nothing ran.
var errDeferred = errors.New("deferred")

// remoteRoutine makes spec start the routine's worker on the host sel
// picks, as a confined unit of that host's systemd
// (klbr-routine-<session>-<generation>.service) whose protocol crosses the
// host's one SSH connection: the runtime and the release's tree travel
// content-addressed (sent once per hash), and every request of the
// routine is answered here. It returns the release tree's path on the host
// and the host's slot to give back. A host that is not ready puts the job
// back to pending (errDeferred).
func (m *Manager) remoteRoutine(ctx context.Context, j store.Job, sel string, spec *worker.Spec, tree string) (string, func(), error) {
	if m.cfg.Hosts == nil {
		return "", nil, fmt.Errorf("host %q: klbr.toml defines no [hosts.NAME] any more", sel)
	}
	host, release, err := m.cfg.Hosts.Reserve(sel)
	if errors.Is(err, hosts.ErrNoRoom) {
		m.deferRun(j, fmt.Sprintf("waiting for a job slot: %v", err), time.Second)
		return "", nil, errDeferred
	}
	if err != nil {
		return "", nil, err
	}
	put := func(dir string) (string, error) {
		t, err := m.trees.pack(dir)
		if err != nil {
			return "", err
		}
		d, _, err := m.cfg.Hosts.PutTree(ctx, host, t)
		return d, err
	}
	runtime, err := put(m.cfg.RuntimeSrc)
	var hostTree string
	if err == nil {
		hostTree, err = put(tree)
	}
	var he *hosts.HostError
	if errors.As(err, &he) {
		release()
		m.deferRun(j, err.Error(), backoff(j.Runs))
		return "", nil, errDeferred
	}
	if err != nil {
		release()
		return "", nil, fmt.Errorf("host %s: %w", host, err)
	}
	if err := m.writePlace(j.ID, host); err != nil {
		m.cfg.Log.Warn("jobs: record a routine's host", "job", j.ID, "error", err)
	}
	spec.Kernel, spec.Python, spec.RuntimeSrc, spec.Behavior = "klbr-kernel", "python3", runtime, hostTree
	spec.Workspace, spec.Placer = "", nil
	spec.Remote = hosts.WorkerUnit{Engine: m.cfg.Hosts, Host: host, Name: hosts.WorkerUnitName(spec.Role, spec.Session, spec.Generation)}
	return hostTree, release, nil
}
