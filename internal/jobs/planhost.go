package jobs

import (
	"encoding/json"
	"fmt"

	"github.com/klbr-dev/klbr/internal/store"
)

// planHost sends the job nj to the worker host job.plan chose: a
// [hosts.NAME] or "label:L" that klbr.toml has, checked here as the cell's
// own host= is. A choice no host matches, or one for a job that cannot run
// on a host, refuses the job (ErrRefused) with what to change.
func (m *Manager) planHost(nj *store.NewJob, host string) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: job.plan chose host %q: %s", ErrRefused, host, fmt.Sprintf(format, args...))
	}
	if m.cfg.Hosts == nil {
		return refuse("klbr.toml defines no [hosts.NAME]; change job.plan or add the host")
	}
	if err := m.cfg.Hosts.Check(host); err != nil {
		return refuse("%v; change job.plan or klbr.toml", err)
	}
	switch nj.Kind {
	case KindCommand:
		var s CommandSpec
		if err := json.Unmarshal(nj.Spec, &s); err != nil {
			return fmt.Errorf("job.plan host: %w", err)
		}
		// A command with no cwd= runs in the workspace here; on a host it
		// runs in a directory of its own. An explicit cwd= names a
		// directory of this machine: no host has it.
		if s.Cwd != "" && s.Cwd != nj.Workspace {
			return refuse("the command runs in %s (cwd=), a directory of this machine; a job on a host runs in a directory of its own there", s.Cwd)
		}
		s.Cwd, s.Host = "", host
		nj.Spec = mustJSON(s)
	case KindRoutine, KindSource:
		var s RoutineSpec
		if err := json.Unmarshal(nj.Spec, &s); err != nil {
			return fmt.Errorf("job.plan host: %w", err)
		}
		s.Host = host
		nj.Spec = mustJSON(s)
	default:
		return refuse("a %s job cannot be sent to a host", nj.Kind)
	}
	return nil
}
