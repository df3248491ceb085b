package doctor

import (
	"fmt"
	"io/fs"
	"os"
	"strings"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/profiles"
)

// profileRoutes are the routes the default tree's profiles name (none
// when the tree cannot be read: checkProfiles says why).
func profileRoutes(cfg *config.Config) []string {
	src, _ := defaultTree(cfg)
	ps, err := profiles.ListFS(src)
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.Routes()...)
	}
	return out
}

// defaultTree is the default behavior tree (the embedded one, or
// KLBR_BEHAVIOR_DIR) and where it comes from.
func defaultTree(cfg *config.Config) (fs.FS, string) {
	if cfg.Paths.BehaviorDir != "" {
		return os.DirFS(cfg.Paths.BehaviorDir), cfg.Paths.BehaviorDir
	}
	return behaviortree.Tree(), "the embedded default release"
}

// checkProfiles lists the child agent profiles of the default behavior
// tree (the embedded one, or KLBR_BEHAVIOR_DIR) and warns of each whose
// route klbr.toml does not configure: a spawn with it is refused.
func checkProfiles(cfg *config.Config, add func(Check)) {
	src, from := defaultTree(cfg)
	ps, err := profiles.ListFS(src)
	if err != nil {
		add(Check{Name: "profiles", Detail: fmt.Sprintf("%s: %v", from, err), Fix: "fix the profile: the tree does not publish"})
		return
	}
	var names []string
	for _, p := range ps {
		route := "the agent's routes"
		if p.Route != "" {
			route = "route " + strings.Join(p.Routes(), ", ")
		}
		names = append(names, fmt.Sprintf("%s (%s)", p.Name, route))
		for _, r := range p.Routes() {
			if _, ok := cfg.File.Routes[r]; !ok {
				add(Check{Name: "profile " + p.Name, OK: true, Warn: true,
					Detail: fmt.Sprintf("names route %q, which %s does not configure: agents.spawn(profile=%q) is refused", r, cfg.Paths.ConfigFile, p.Name),
					Fix:    fmt.Sprintf("add [routes.%s] to %s, or change profiles/%s.toml in a draft", r, cfg.Paths.ConfigFile, p.Name)})
			}
		}
	}
	if len(names) == 0 {
		names = []string{"none"}
	}
	add(Check{Name: "profiles", OK: true, Detail: fmt.Sprintf("%s, in %s", strings.Join(names, "; "), from)})
}
