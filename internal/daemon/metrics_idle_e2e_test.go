package daemon

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/modeltest"
)

// An idle daemon with a route exports every series the Grafana dashboard
// and the alert rules read, before anything happened: a panel shows 0 and
// a rule can tell idle from a dead exporter. The hook latency histogram has
// each slot. Only the worker hosts' series wait for a [hosts] section.
func TestIdleDaemonExportsWhatTheDashboardReads(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	a := startAgent(t, model, "")
	a.eventually("the session is ready", func() bool { return a.session().State == "ready" })
	body := a.scrape()

	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(klbr_[a-z0-9_]+?)(_bucket|_sum|_count)?[{ ]`).FindAllStringSubmatch(body, -1) {
		exported[m[1]] = true
	}
	named := map[string]string{}
	for _, f := range []string{"../../nix/grafana/klbr.json", "../../nix/prometheus/klbr-rules.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range regexp.MustCompile(`klbr_[a-z0-9_]+`).FindAllString(string(b), -1) {
			n = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
			named[n] = f
		}
	}
	for n, f := range named {
		if strings.HasPrefix(n, "klbr_host_") {
			continue // one series per [hosts.NAME]; this daemon has none
		}
		if !exported[n] {
			t.Errorf("%s reads %s, which an idle daemon does not export", f, n)
		}
	}
	for _, slot := range hooks.SlotNames() {
		if !strings.Contains(body, `klbr_hook_invocation_duration_seconds_count{outcome="ok",slot="`+slot+`"} 0`) {
			t.Errorf("no zero hook latency histogram for slot %s", slot)
		}
	}
	if !strings.Contains(body, `klbr_prompt_cache_hit_ratio{route="main"} 0`) {
		t.Errorf("no zero prompt cache ratio for route main")
	}
}
