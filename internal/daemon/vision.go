package daemon

import (
	"fmt"
	"io"
	"os"

	"github.com/klbr-dev/klbr/internal/config"
)

// vision says whether a route the agent's requests may go to takes images
// ([routes.X] vision = true): only then does the turn loop read them.
func vision(f config.File) bool {
	for _, name := range f.StepRoutes() {
		if f.Routes[name].Vision {
			return true
		}
	}
	return false
}

// readImage reads at most max bytes of the artifact sha (a fetched
// attachment) for a model request; the digest comes from the store.
func (d *daemon) readImage(sha string, max int64) ([]byte, error) {
	if d.bench == nil || d.bench.Config().Artifacts == nil {
		return nil, fmt.Errorf("image %s: no artifact store", sha)
	}
	p, err := d.bench.Config().Artifacts.Path(sha)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("image %s: more than %d bytes", sha, max)
	}
	return b, nil
}
