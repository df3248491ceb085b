package nix_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// renderDropIn writes a [Service] section from a NixOS service's
// serviceConfig and environment as NixOS does for a unit that
// systemd.packages ships (its overrides.conf): a list is one line per
// element (an empty one resets the setting), a bool is true/false.
func renderDropIn(t *testing.T, svc map[string]any) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("[Service]\n")
	env, _ := svc["environment"].(map[string]any)
	for _, k := range slices.Sorted(mapsKeys(env)) {
		fmt.Fprintf(&b, "Environment=%s\n", strconv.Quote(k+"="+fmt.Sprint(env[k])))
	}
	sc, _ := svc["serviceConfig"].(map[string]any)
	for _, k := range slices.Sorted(mapsKeys(sc)) {
		vals, ok := sc[k].([]any)
		if !ok {
			vals = []any{sc[k]}
		}
		for _, v := range vals {
			fmt.Fprintf(&b, "%s=%v\n", k, v)
		}
	}
	return b.String()
}

func mapsKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// exposure is one unit's systemd-analyze security verdict.
type exposure struct {
	Score float64
	Level string
	Out   string
}

var overallRE = regexp.MustCompile(`Overall exposure level for (\S+): ([0-9.]+) (\S+)`)

// analyze installs unit (as shipped, from nix/systemd) with dropIn as its
// overrides.conf in a directory of its own and runs systemd-analyze security
// on it offline: the unit as a NixOS host with the module loads it.
func analyze(t *testing.T, sa, unit, dropIn string) exposure {
	t.Helper()
	dir := t.TempDir()
	shipped, err := os.ReadFile(filepath.Join(repoRoot(t), "nix", "systemd", unit))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, unit), shipped, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, unit+".d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, unit+".d", "overrides.conf"), []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sa, "security", "--offline=true", "--no-pager", filepath.Join(dir, unit))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=true %s: %v\n%s", unit, err, out)
	}
	m := overallRE.FindStringSubmatch(string(out))
	if m == nil || m[1] != unit {
		t.Fatalf("no overall exposure for %s in:\n%s", unit, out)
	}
	score, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		t.Fatal(err)
	}
	return exposure{Score: score, Level: m[3], Out: string(out)}
}

// directives reads the [Service] settings of a unit file and drop-in, in
// order: key → values, where an empty value resets the list before it.
func directives(texts ...string) map[string][]string {
	d := map[string][]string{}
	for _, text := range texts {
		section := ""
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' || line[0] == ';' {
				continue
			}
			if line[0] == '[' {
				section = line
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok || section != "[Service]" {
				continue
			}
			if v == "" {
				d[k] = []string{""}
				continue
			}
			d[k] = append(d[k], v)
		}
	}
	return d
}

// hardening are the sandboxing settings klbr-core.service sets; each is
// compared between the two services.
var hardening = []string{
	"NoNewPrivileges", "CapabilityBoundingSet", "ProtectSystem", "ProtectHome", "PrivateTmp",
	"PrivateDevices", "PrivateMounts", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
	"ProtectControlGroups", "ProtectClock", "ProtectHostname", "ProtectProc", "ProcSubset",
	"RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
	"LockPersonality", "MemoryDenyWriteExecute", "SystemCallArchitectures", "SystemCallFilter",
	"SystemCallErrorNumber", "UMask", "RemoveIPC", "PrivateUsers", "IPAddressDeny",
}

// stricterInDiscord are klbr-core's settings that klbr-discord replaces
// with stricter ones, and why.
var stricterInDiscord = map[string]string{
	// klbr-core's workers read the user's files; klbr-discord reads none.
	"ProtectHome=read-only": "ProtectHome=yes",
	// Landlock is what klbr-kernel confines its workers with; klbr-discord
	// has no workers, and its own filter denies @privileged and @resources.
	"SystemCallFilter=landlock_create_ruleset landlock_add_rule landlock_restrict_self": "SystemCallFilter=~@privileged @resources",
}

// TestUnitsExposure renders klbr-core.service and klbr-discord.service as
// the NixOS module configures them (the shipped unit and the module's
// drop-in) and holds both to systemd-analyze security's "OK" or better,
// and klbr-discord to every sandboxing setting of klbr-core's or a
// stricter one. The scores are in docs/deploy.md.
func TestUnitsExposure(t *testing.T) {
	lib := nixpkgsLib(t)
	ni := requireTool(t, "nix-instantiate", "nix-bin")
	sa := requireTool(t, "systemd-analyze", "systemd")
	ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; credentials.openai-key = "/run/secrets/openai-key";
		discord = { enable = true; tokenFile = "/run/secrets/discord"; }; }; }`)

	got := map[string]exposure{}
	effective := map[string]map[string][]string{}
	for _, name := range []string{"klbr-core", "klbr-discord"} {
		unit := name + ".service"
		svc := ev.Systemd.Services[name]
		if svc == nil {
			t.Fatalf("the module configures no %s", unit)
		}
		dropIn := renderDropIn(t, svc)
		e := analyze(t, sa, unit, dropIn)
		got[name] = e
		t.Logf("systemd-analyze security --offline=true %s (shipped unit + the module's drop-in): %.1f %s", unit, e.Score, e.Level)
		// OK is an exposure below 5.0; SAFE below 1.0; PERFECT 0.
		if !slices.Contains([]string{"OK", "SAFE", "PERFECT"}, e.Level) || e.Score >= 5.0 {
			t.Errorf("%s: exposure %.1f %s, want OK or better:\n%s", unit, e.Score, e.Level, e.Out)
		}
		shipped, err := os.ReadFile(filepath.Join(repoRoot(t), "nix", "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		effective[name] = directives(string(shipped), dropIn)
	}

	core, discord := effective["klbr-core"], effective["klbr-discord"]
	if core["User"] == nil || discord["DynamicUser"] == nil {
		t.Errorf("User = %q (klbr-core), DynamicUser = %q (klbr-discord): the module runs neither as root", core["User"], discord["DynamicUser"])
	}
	for _, key := range hardening {
		for _, v := range core[key] {
			want := key + "=" + v
			if s, ok := stricterInDiscord[want]; ok {
				want = s
			}
			k, wv, _ := strings.Cut(want, "=")
			if !slices.Contains(discord[k], wv) {
				t.Errorf("klbr-core.service has %s=%s, klbr-discord.service lacks %s (has %q)", key, v, want, discord[k])
			}
		}
	}
	if got["klbr-discord"].Score > got["klbr-core"].Score {
		t.Errorf("klbr-discord.service (%.1f) is more exposed than klbr-core.service (%.1f)", got["klbr-discord"].Score, got["klbr-core"].Score)
	}
}
