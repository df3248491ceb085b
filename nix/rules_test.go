package nix_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The alert rules under nix/prometheus: promtool accepts them, their unit
// tests pass, every alert fires in at least one test, and (in
// TestDashboardQueriesExposedMetrics) every metric they query is one
// klbr-core exposes.

var (
	ruleAlert = regexp.MustCompile(`(?m)^\s*- alert: (\w+)\s*$`)
	ruleExpr  = regexp.MustCompile(`(?m)^\s*expr: (.+)$`)
)

func rulesDir(t *testing.T) string { return filepath.Join(repoRoot(t), "nix", "prometheus") }

func readRules(t *testing.T) (alerts, exprs []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rulesDir(t), "klbr-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ruleAlert.FindAllStringSubmatch(string(b), -1) {
		alerts = append(alerts, m[1])
	}
	for _, m := range ruleExpr.FindAllStringSubmatch(string(b), -1) {
		exprs = append(exprs, strings.TrimSpace(m[1]))
	}
	return alerts, exprs
}

func TestAlertRules(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	dir := rulesDir(t)
	for _, args := range [][]string{{"check", "rules", "klbr-rules.yml"}, {"test", "rules", "klbr-rules.test.yml"}} {
		c := exec.Command(promtool, args...)
		c.Dir = dir
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	alerts, exprs := readRules(t)
	if len(alerts) < 8 || len(exprs) != len(alerts) {
		t.Fatalf("read %d alerts and %d expressions from klbr-rules.yml", len(alerts), len(exprs))
	}
	tests, err := os.ReadFile(filepath.Join(dir, "klbr-rules.test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// An alert "fires in its test" when some alert_rule_test of it expects
	// alerts (exp_alerts followed by an entry, not []).
	fires := map[string]bool{}
	var current string
	lines := strings.Split(string(tests), "\n")
	for i, l := range lines {
		if m := regexp.MustCompile(`alertname: (\w+)`).FindStringSubmatch(l); m != nil {
			current = m[1]
		}
		if strings.TrimSpace(l) == "exp_alerts:" && i+1 < len(lines) && strings.Contains(lines[i+1], "- exp_labels:") {
			fires[current] = true
		}
	}
	for _, a := range alerts {
		if !fires[a] {
			t.Errorf("alert %s fires in no test of klbr-rules.test.yml", a)
		}
	}
}
