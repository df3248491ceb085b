package workbench

import (
	"context"
	"errors"
	"io"
	"path"

	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/worker"
)

type generationKey struct{}

func withGeneration(ctx context.Context, gen int64) context.Context {
	return context.WithValue(ctx, generationKey{}, gen)
}

// HostDir is a directory on a worker host that a session's cells work in.
type HostDir struct {
	Host string
	// Dir is its name beneath the host's work root: the asking generation's unit
	// (klbr-workbench-…service, a root workbench's own directory) or a child's copy
	// (klbr-ws-…).
	Dir string
	// Kernel is klbr-kernel on the host ("": looked up on the login's PATH).
	Kernel string

	hosts *hosts.Engine
}

// Read writes the file name beneath the directory to w, at most max bytes, as the host's
// klbr-kernel reads it: no link followed, nothing outside (hosts.Engine.ReadBeneath).
func (d HostDir) Read(ctx context.Context, name string, max int64, w io.Writer) error {
	return d.hosts.ReadBeneath(ctx, d.Host, d.Kernel, d.Dir, name, max, w)
}

// HostDirOf is where the cell asking under ctx works when its session's workbench runs
// on a worker host; ok false: here. Only a request of a running cell (ctx from
// Execute) names a root workbench's directory: each generation has its own.
func (m *Manager) HostDirOf(ctx context.Context, session string) (d HostDir, ok bool, err error) {
	if m.remoteFor(session) {
		gen, found := ctx.Value(generationKey{}).(int64)
		if !found {
			return d, false, errors.New("no cell of the workbench on a worker host is asking")
		}
		r := m.cfg.Remote
		return HostDir{Host: r.Host, Dir: hosts.WorkerUnitName(worker.RoleWorkbench, session, gen), Kernel: r.Kernel, hosts: r.Hosts}, true, nil
	}
	p, onHost, err := m.hostPlace(ctx, session)
	if err != nil || !onHost {
		return d, false, err
	}
	r, err := m.remoteOn(p.Host)
	if err != nil {
		return d, false, err
	}
	return HostDir{Host: p.Host, Dir: path.Base(p.Dir), Kernel: r.Kernel, hosts: r.Hosts}, true, nil
}
