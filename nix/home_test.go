package nix_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// homeEval is what nix/tests/home-eval.nix returns. SystemdUser is Home
// Manager's systemd.user: kind (services, sockets, slices) → name →
// unit (section → setting → value).
type homeEval struct {
	Options          []string                             `json:"options"`
	FailedAssertions []string                             `json:"failedAssertions"`
	Settings         map[string]any                       `json:"settings"`
	Packages         []string                             `json:"packages"`
	SessionVariables map[string]string                    `json:"sessionVariables"`
	SystemdUser      map[string]map[string]map[string]any `json:"systemdUser"`
}

// evalHome evaluates nix/home.nix with the Home Manager configuration cfg.
func evalHome(t *testing.T, nixInstantiate, lib, cfg string) (*homeEval, string) {
	t.Helper()
	harness := filepath.Join(repoRoot(t), "nix", "tests", "home-eval.nix")
	expr := "import " + harness + " { lib = import " + lib + "; config = " + cfg + "; }"
	cmd := exec.Command(nixInstantiate, "--eval", "--strict", "--json", "-E", expr)
	cmd.Env = nixEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String()
	}
	var ev homeEval
	dec := json.NewDecoder(&stdout)
	dec.UseNumber()
	if err := dec.Decode(&ev); err != nil {
		t.Fatalf("decode the evaluation: %v", err)
	}
	ev.Settings, _ = numbers(ev.Settings).(map[string]any)
	return &ev, ""
}

func mustHome(t *testing.T, nixInstantiate, lib, cfg string) *homeEval {
	t.Helper()
	ev, errText := evalHome(t, nixInstantiate, lib, cfg)
	if ev == nil {
		t.Fatalf("evaluating the Home Manager module with %s failed:\n%s", cfg, errText)
	}
	return ev
}

// renderUnit writes one unit as Home Manager does: each attribute set a
// section, a list one line per element, a bool true/false.
func renderUnit(sections map[string]any) string {
	var b strings.Builder
	order := []string{"Unit", "Service", "Socket", "Slice", "Install"}
	for name := range sections {
		if !slices.Contains(order, name) {
			order = append(order, name)
		}
	}
	for _, sec := range order {
		kv, ok := sections[sec].(map[string]any)
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "[%s]\n", sec)
		for _, k := range slices.Sorted(mapsKeys(kv)) {
			vals, ok := kv[k].([]any)
			if !ok {
				vals = []any{kv[k]}
			}
			for _, v := range vals {
				fmt.Fprintf(&b, "%s=%v\n", k, v)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// writeUserUnits renders every unit of ev into dir (the commands in the
// package replaced by stub, which exists) and returns their file names.
func writeUserUnits(t *testing.T, ev *homeEval, dir, stub string) []string {
	t.Helper()
	var names []string
	for kind, suffix := range map[string]string{"services": ".service", "sockets": ".socket", "slices": ".slice"} {
		for name, unit := range ev.SystemdUser[kind] {
			sections := map[string]any{}
			for k, v := range unit {
				sections[k] = v
			}
			text := strings.ReplaceAll(renderUnit(sections), "/nix/store/11111111111111111111111111111111-klbr/bin/klbr-core", stub)
			text = strings.ReplaceAll(text, "/nix/store/11111111111111111111111111111111-klbr/bin/klbr-discord", stub)
			text = strings.ReplaceAll(text, "/nix/store/33333333333333333333333333333333-coreutils/bin/kill", "/bin/kill")
			file := name + suffix
			if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			names = append(names, file)
		}
	}
	slices.Sort(names)
	return names
}

// TestHomeManagerModuleEvaluates runs lib.evalModules over nix/home.nix
// with Home Manager's options stubbed (nix/tests/home-eval.nix), renders
// its user units and has systemd-analyze --user verify read them.
func TestHomeManagerModuleEvaluates(t *testing.T) {
	lib := nixpkgsLib(t)
	ni := requireTool(t, "nix-instantiate", "nix-bin")

	t.Run("disabled does nothing", func(t *testing.T) {
		ev := mustHome(t, ni, lib, `{ }`)
		if len(ev.Packages) != 0 || len(ev.SystemdUser) != 0 || len(ev.SessionVariables) != 0 {
			t.Fatalf("a disabled module changed the home: %+v", ev)
		}
		want := []string{"services.klbr.discord.enable", "services.klbr.discord.tokenFile", "services.klbr.enable",
			"services.klbr.httpAddress", "services.klbr.package", "services.klbr.sandbox.namespaces", "services.klbr.settings"}
		if got := slices.Sorted(slices.Values(ev.Options)); !slices.Equal(got, want) {
			t.Fatalf("options:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("enabled with defaults", func(t *testing.T) {
		ev := mustHome(t, ni, lib, `{ services.klbr.enable = true; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Fatalf("failed assertions: %q", ev.FailedAssertions)
		}
		if !slices.Equal(ev.Packages, []string{"/nix/store/11111111111111111111111111111111-klbr"}) {
			t.Errorf("home.packages = %q, want the package (the CLI)", ev.Packages)
		}
		if got := ev.SessionVariables["KLBR_CONTROL_SOCKET"]; got != "${XDG_RUNTIME_DIR}/klbr/control.sock" {
			t.Errorf("KLBR_CONTROL_SOCKET = %q", got)
		}
		sockets := ev.SystemdUser["sockets"]
		for name, listen := range map[string]string{"klbr-core": "127.0.0.1:8765", "klbr-core-control": "%t/klbr/control.sock", "klbr-core-ingress": "%t/klbr/ingress.sock"} {
			s := sockets[name]
			if get(s, "Socket", "ListenStream") != listen || get(s, "Socket", "Service") != "klbr-core.service" {
				t.Errorf("%s.socket = %v, want it listening on %s for klbr-core.service", name, s, listen)
			}
			if !slices.Equal(strList(get(s, "Install", "WantedBy")), []string{"sockets.target"}) {
				t.Errorf("%s.socket is not wanted by sockets.target: %v", name, s["Install"])
			}
			if name != "klbr-core" && get(s, "Socket", "SocketMode") != "0600" {
				t.Errorf("%s.socket SocketMode = %v, want 0600 (this user alone)", name, get(s, "Socket", "SocketMode"))
			}
		}
		core := ev.SystemdUser["services"]["klbr-core"]
		if _, ok := core["Install"]; ok {
			t.Errorf("klbr-core.service has [Install] %v: its sockets start it", core["Install"])
		}
		env := strList(get(core, "Service", "Environment"))
		for _, want := range []string{"KLBR_CONFIG=/nix/store/00000000000000000000000000000000-klbr.toml", "KLBR_DATA_DIR=%S/klbr",
			"KLBR_CONTROL_SOCKET=%t/klbr/control.sock", "KLBR_SYSTEMD_BUS=unix:path=%t/systemd/private"} {
			if !slices.Contains(env, want) {
				t.Errorf("klbr-core.service Environment lacks %s: %q", want, env)
			}
		}
		if get(core, "Service", "Type") != "notify" || get(core, "Service", "ExecStart") != "/nix/store/11111111111111111111111111111111-klbr/bin/klbr-core serve" {
			t.Errorf("klbr-core.service [Service] = %v", core["Service"])
		}
		if get(core, "Service", "ProtectSystem") != nil {
			t.Errorf("namespace sandboxing is on by default: %v", core["Service"])
		}
		if sl := ev.SystemdUser["slices"]["klbr"]; get(sl, "Slice", "MemoryAccounting") != true {
			t.Errorf("klbr.slice = %v, want the user manager's slice for the workers", sl)
		}
		if _, ok := ev.SystemdUser["services"]["klbr-discord"]; ok {
			t.Errorf("klbr-discord configured though discord is disabled")
		}
		f := checkSettingsParse(t, ev.Settings)
		if f.Limits.MemoryMax != "2G" || f.Limits.TasksMax != 256 {
			t.Errorf("default limits = %+v", f.Limits)
		}
	})

	t.Run("the settings type is the NixOS module's", func(t *testing.T) {
		for _, settings := range []string{`{ }`, `{
			agent.route = "main";
			routes.main = { url = "http://localhost:8001/v1"; model = "local"; api_key_file = "/home/alice/.config/klbr/secrets/openai-key"; };
			limits = { memory_max = "4G"; tasks_max = 512; };
			telemetry.otlp_endpoint = "http://127.0.0.1:4318";
		}`} {
			home := mustHome(t, ni, lib, `{ services.klbr = { enable = true; settings = `+settings+`; }; }`)
			nixos := mustEval(t, ni, lib, `{ services.klbr = { enable = true; settings = `+settings+`; }; }`)
			if !reflect.DeepEqual(home.Settings, nixos.Settings) {
				t.Errorf("settings %s:\nHome Manager %v\nNixOS        %v", settings, home.Settings, nixos.Settings)
			}
			checkSettingsParse(t, home.Settings)
		}
		for _, bad := range []string{`memory_max = "2 GB"`, `tasks_max = 0`} {
			if ev, errText := evalHome(t, ni, lib, `{ services.klbr = { enable = true; settings.limits.`+bad+`; }; }`); ev != nil || !strings.Contains(errText, "limits") {
				t.Errorf("limits.%s was accepted: %v\n%s", bad, ev, errText)
			}
		}
	})

	t.Run("a secret in the Nix store is refused", func(t *testing.T) {
		ev := mustHome(t, ni, lib, `{ services.klbr = { enable = true; settings.routes.main = {
			url = "http://localhost:8001/v1"; model = "m"; api_key_file = "/nix/store/33333333333333333333333333333333-key"; }; }; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "services.klbr.settings.routes.main.api_key_file") {
			t.Fatalf("failed assertions = %q, want the one naming api_key_file", ev.FailedAssertions)
		}
		if ev, errText := evalHome(t, ni, lib, `{ services.klbr = { enable = true; discord = { enable = true; tokenFile = "/nix/store/22222222222222222222222222222222-token"; }; }; }`); ev != nil || !strings.Contains(errText, "tokenFile") {
			t.Fatalf("a token file in the store was accepted: %v\n%s", ev, errText)
		}
	})

	t.Run("discord", func(t *testing.T) {
		ev := mustHome(t, ni, lib, `{ services.klbr = { enable = true; discord.enable = true; }; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "tokenFile must be set") {
			t.Fatalf("failed assertions = %q, want the tokenFile one", ev.FailedAssertions)
		}
		ev = mustHome(t, ni, lib, `{ services.klbr = { enable = true; discord = { enable = true; tokenFile = "/home/alice/.config/klbr/secrets/discord"; }; }; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Fatalf("failed assertions: %q", ev.FailedAssertions)
		}
		d := ev.SystemdUser["services"]["klbr-discord"]
		if !slices.Equal(strList(get(d, "Install", "WantedBy")), []string{"default.target"}) {
			t.Errorf("klbr-discord.service Install = %v, want it started with the user manager", d["Install"])
		}
		if !slices.Contains(strList(get(d, "Service", "Environment")), "KLBR_INGRESS_SOCKET=%t/klbr/ingress.sock") {
			t.Errorf("klbr-discord.service Environment = %v", get(d, "Service", "Environment"))
		}
		if f := checkSettingsParse(t, ev.Settings); !f.Discord.Enabled || f.Discord.TokenFile != "/home/alice/.config/klbr/secrets/discord" {
			t.Errorf("settings.discord = %+v, want enabled with the token file", f.Discord)
		}
	})

	t.Run("systemd reads the user units", func(t *testing.T) {
		sa := requireTool(t, "systemd-analyze", "systemd")
		for _, ns := range []bool{false, true} {
			ev := mustHome(t, ni, lib, fmt.Sprintf(`{ services.klbr = { enable = true; sandbox.namespaces = %t;
				discord = { enable = true; tokenFile = "/home/alice/.config/klbr/secrets/discord"; }; }; }`, ns))
			dir := t.TempDir()
			stub := filepath.Join(dir, "stub")
			if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			units := writeUserUnits(t, ev, dir, stub)
			if want := []string{"klbr-core-control.socket", "klbr-core-ingress.socket", "klbr-core.service", "klbr-core.socket", "klbr-discord.service", "klbr.slice"}; !slices.Equal(units, want) {
				t.Fatalf("user units = %q, want %q", units, want)
			}
			// verify warns (and still exits 0) on an unknown setting or a
			// value it cannot parse: any output is a failure.
			cmd := exec.Command(sa, append([]string{"--user", "verify", "--man=no"}, units...)...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+dir)
			if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
				t.Errorf("systemd-analyze --user verify (sandbox.namespaces = %t): %v\n%s", ns, err, out)
			}
			for _, unit := range []string{"klbr-core.service", "klbr-discord.service"} {
				cmd := exec.Command(sa, "--user", "security", "--offline=true", "--no-pager", unit)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+dir)
				out, err := cmd.CombinedOutput()
				m := overallRE.FindStringSubmatch(string(out))
				if err != nil || m == nil {
					t.Fatalf("systemd-analyze --user security %s: %v\n%s", unit, err, out)
				}
				t.Logf("user unit %s, sandbox.namespaces = %t: exposure %s %s", unit, ns, m[2], m[3])
			}
		}
	})
}
