package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
)

// InForce is what a running daemon runs: its agent line (as status shows
// it) and the klbr.toml it read last.
type InForce struct {
	Agent  string
	Config api.ConfigInForce
}

// checkInForce names the route the running daemon runs, as status and the
// browser do, and warns when klbr.toml is no longer what the daemon read
// (edited and not reloaded, or a reload refused). cfg is nil when the file
// does not load (loadErr).
func checkInForce(ctx context.Context, ask func(context.Context) (*InForce, error), cfg *config.Config, loadErr error, add func(Check)) {
	if ask == nil {
		return
	}
	live, err := ask(ctx)
	switch {
	case err != nil:
		add(Check{Name: "agent", OK: true, Warn: true, Detail: "could not ask the running daemon what it runs: " + err.Error(),
			Fix: "klbr-core status shows it"})
		return
	case live == nil:
		return // no daemon serves: the file is what the next start runs
	}
	read := "defaults (no klbr.toml)"
	if live.Config.Digest != "" {
		read = "klbr.toml as read at " + live.Config.ReadAt.Local().Format(time.DateTime)
	}
	c := Check{Name: "agent", OK: true, Detail: fmt.Sprintf("the running daemon runs %s (%s)", live.Agent, read)}
	switch {
	case loadErr != nil:
		c.Warn = true
		c.Detail += "; the file does not load now, so a reload is refused and this stays in force"
		c.Fix = "correct klbr.toml (see the config line), then klbr-core reload"
	case cfg != nil && cfg.Digest != live.Config.Digest:
		c.Warn = true
		c.Detail += "; klbr.toml changed since, and the checks above are of the file"
		c.Fix = "klbr-core reload applies it (and names what needs a restart)"
	}
	add(c)
}
