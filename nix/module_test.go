package nix_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/pelletier/go-toml/v2"
)

// nixEnv is the environment nix-instantiate runs in: Debian's nix-bin
// configures a build-users group that does not exist on a machine without a
// Nix daemon, and warns about it on every call.
func nixEnv() []string {
	return append(os.Environ(), "NIX_CONFIG=build-users-group =")
}

// nixpkgsLib returns the nixpkgs lib directory KLBR_NIXPKGS_LIB names (a
// nixpkgs checkout, a nix-community/nixpkgs.lib checkout, or its lib/), or
// skips the test. There is no nixpkgs on a Debian machine and none is
// fetched by the tests, so under CI this skips too, saying so.
func nixpkgsLib(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KLBR_NIXPKGS_LIB")
	if dir == "" {
		t.Skip("KLBR_NIXPKGS_LIB is not set: skipping the lib.evalModules check of the NixOS modules " +
			"(point it at a nixpkgs or nix-community/nixpkgs.lib checkout to run it)")
	}
	for _, cand := range []string{filepath.Join(dir, "lib"), dir} {
		if _, err := os.Stat(filepath.Join(cand, "modules.nix")); err == nil {
			abs, err := filepath.Abs(cand)
			if err != nil {
				t.Fatal(err)
			}
			return abs
		}
	}
	t.Fatalf("KLBR_NIXPKGS_LIB=%s holds no lib/modules.nix", dir)
	return ""
}

// moduleEval is what nix/tests/module-eval.nix returns.
type moduleEval struct {
	Options          []string       `json:"options"`
	FailedAssertions []string       `json:"failedAssertions"`
	Warnings         []string       `json:"warnings"`
	Settings         map[string]any `json:"settings"`
	Environment      struct {
		SystemPackages []string          `json:"systemPackages"`
		Variables      map[string]string `json:"variables"`
	} `json:"environment"`
	Systemd struct {
		Packages []string                  `json:"packages"`
		Services map[string]map[string]any `json:"services"`
		Sockets  map[string]map[string]any `json:"sockets"`
	} `json:"systemd"`
	Users struct {
		Users  map[string]map[string]any `json:"users"`
		Groups map[string]map[string]any `json:"groups"`
	} `json:"users"`
	Security struct {
		Polkit struct {
			Enable      bool   `json:"enable"`
			ExtraConfig string `json:"extraConfig"`
		} `json:"polkit"`
	} `json:"security"`
	Grafana    map[string]any `json:"grafana"`
	Prometheus map[string]any `json:"prometheus"`
}

// evalModule evaluates the module with the NixOS configuration cfg (a Nix
// expression). It returns the result, or the evaluation error's text.
func evalModule(t *testing.T, nixInstantiate, lib, cfg string) (*moduleEval, string) {
	t.Helper()
	harness := filepath.Join(repoRoot(t), "nix", "tests", "module-eval.nix")
	expr := "import " + harness + " { lib = import " + lib + "; config = " + cfg + "; }"
	cmd := exec.Command(nixInstantiate, "--eval", "--strict", "--json", "-E", expr)
	cmd.Env = nixEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String()
	}
	var ev moduleEval
	dec := json.NewDecoder(&stdout)
	dec.UseNumber() // Nix integers stay integers in the TOML rendered from them
	if err := dec.Decode(&ev); err != nil {
		t.Fatalf("decode the evaluation: %v", err)
	}
	ev.Settings, _ = numbers(ev.Settings).(map[string]any)
	return &ev, ""
}

// mustEval is evalModule that fails the test on an evaluation error.
func mustEval(t *testing.T, nixInstantiate, lib, cfg string) *moduleEval {
	t.Helper()
	ev, errText := evalModule(t, nixInstantiate, lib, cfg)
	if ev == nil {
		t.Fatalf("evaluating the module with %s failed:\n%s", cfg, errText)
	}
	return ev
}

// checkSettingsParse renders the module's settings to TOML as
// pkgs.formats.toml would and checks that klbr-core's own parser accepts
// them: the module's defaults and examples are a klbr.toml klbr-core runs
// with.
func checkSettingsParse(t *testing.T, settings map[string]any) config.File {
	t.Helper()
	data, err := toml.Marshal(settings)
	if err != nil {
		t.Fatalf("render settings %v: %v", settings, err)
	}
	f, err := config.Parse("klbr.toml", data)
	if err != nil {
		t.Fatalf("klbr-core refuses the module's klbr.toml:\n%s\n%v", data, err)
	}
	return f
}

// numbers turns the json.Numbers in v into int64 or float64, as Nix's
// integers and floats, which pkgs.formats.toml writes as TOML integers and
// floats.
func numbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
		return v
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	}
	return v
}

func get(m map[string]any, path ...string) any {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func strList(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, e := range l {
		s, _ := e.(string)
		out = append(out, s)
	}
	return out
}

// TestModuleEvaluates runs lib.evalModules over nix/module.nix: its
// options, defaults, assertions and the drop-ins it makes, case by case.
func TestModuleEvaluates(t *testing.T) {
	lib := nixpkgsLib(t)
	ni := requireTool(t, "nix-instantiate", "nix-bin")

	t.Run("disabled does nothing", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ }`)
		if len(ev.Systemd.Packages) != 0 || len(ev.Systemd.Services) != 0 || len(ev.FailedAssertions) != 0 {
			t.Fatalf("a disabled module changed the system: %+v", ev.Systemd)
		}
		want := []string{
			"services.klbr.backup.directory", "services.klbr.backup.enable", "services.klbr.backup.includeSecrets",
			"services.klbr.backup.keep", "services.klbr.backup.startAt", "services.klbr.credentials", "services.klbr.discord.enable", "services.klbr.discord.tokenFile",
			"services.klbr.enable", "services.klbr.grafana.enable", "services.klbr.group",
			"services.klbr.ingressGroup", "services.klbr.package", "services.klbr.prometheus.enable",
			"services.klbr.prometheus.target", "services.klbr.settings", "services.klbr.user",
		}
		got := slices.Sorted(slices.Values(ev.Options))
		if !slices.Equal(got, want) {
			t.Fatalf("options:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("enabled with defaults", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr.enable = true; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Fatalf("failed assertions: %q", ev.FailedAssertions)
		}
		pkg := "/nix/store/11111111111111111111111111111111-klbr"
		if !slices.Equal(ev.Systemd.Packages, []string{pkg}) {
			t.Errorf("systemd.packages = %q, want the package (its units are the shipped ones)", ev.Systemd.Packages)
		}
		if !slices.Contains(ev.Environment.SystemPackages, pkg) {
			t.Errorf("the CLI is not in environment.systemPackages: %q", ev.Environment.SystemPackages)
		}
		if got := ev.Environment.Variables["KLBR_CONTROL_SOCKET"]; got != "/run/klbr/control.sock" {
			t.Errorf("KLBR_CONTROL_SOCKET = %q, want klbr-core.socket's /run/klbr/control.sock", got)
		}
		for _, name := range []string{"klbr-core", "klbr-core-control", "klbr-core-ingress"} {
			if got := strList(ev.Systemd.Sockets[name]["wantedBy"]); !slices.Equal(got, []string{"sockets.target"}) {
				t.Errorf("%s.socket wantedBy = %q, want sockets.target", name, got)
			}
		}
		for name, want := range map[string][2]string{"klbr-core-control": {"klbr", "0600"}, "klbr-core-ingress": {"klbr-ingress", "0660"}} {
			sock := ev.Systemd.Sockets[name]
			if get(sock, "socketConfig", "SocketUser") != "klbr" || get(sock, "socketConfig", "SocketGroup") != want[0] ||
				get(sock, "socketConfig", "SocketMode") != want[1] {
				t.Errorf("%s.socket socketConfig = %v, want user klbr, group %s, mode %s", name, sock["socketConfig"], want[0], want[1])
			}
		}
		core := ev.Systemd.Services["klbr-core"]
		if _, ok := core["wantedBy"]; ok {
			t.Errorf("klbr-core.service has wantedBy %v: the socket starts it", core["wantedBy"])
		}
		if get(core, "serviceConfig", "User") != "klbr" || get(core, "serviceConfig", "Group") != "klbr" {
			t.Errorf("klbr-core.service serviceConfig = %v", core["serviceConfig"])
		}
		if _, ok := get(core, "serviceConfig").(map[string]any)["LoadCredential"]; ok {
			t.Errorf("LoadCredential set without credentials: %v", core["serviceConfig"])
		}
		if rl := strList(get(core, "serviceConfig", "ExecReload")); len(rl) != 2 || rl[0] != "" || !strings.HasSuffix(rl[1], "/bin/klbr-core reload") {
			t.Errorf("klbr-core.service ExecReload = %q, want the shipped one replaced by klbr-core reload", rl)
		}
		conf, _ := get(core, "environment", "KLBR_CONFIG").(string)
		if !strings.HasSuffix(conf, "-klbr.toml") {
			t.Errorf("KLBR_CONFIG = %q, want the rendered klbr.toml", conf)
		}
		if !slices.Contains(strList(core["restartTriggers"]), conf) {
			t.Errorf("a changed klbr.toml does not restart klbr-core: restartTriggers = %v", core["restartTriggers"])
		}
		if !slices.Contains(strList(core["path"]), "/nix/store/22222222222222222222222222222222-git") {
			t.Errorf("klbr-core.service path = %v, want git on it (worktree children)", core["path"])
		}
		if core["stopIfChanged"] != false {
			t.Errorf("stopIfChanged = %v, want false (restart in one step while the socket holds connections)", core["stopIfChanged"])
		}
		if _, ok := ev.Systemd.Services["klbr-discord"]; ok {
			t.Errorf("klbr-discord configured though discord is disabled")
		}
		if get(ev.Users.Users["klbr"], "isSystemUser") != true {
			t.Errorf("users.users.klbr = %v, want a system user", ev.Users.Users["klbr"])
		}
		for _, g := range []string{"klbr", "klbr-ingress"} {
			if _, ok := ev.Users.Groups[g]; !ok {
				t.Errorf("group %s is not created: %v", g, ev.Users.Groups)
			}
		}
		rule := ev.Security.Polkit.ExtraConfig
		for _, want := range []string{`"org.freedesktop.systemd1.manage-units"`, `subject.user == "klbr"`, `action.lookup("unit")`, `/^klbr-[^\/]+\.scope$/`, `polkit.Result.YES`} {
			if !strings.Contains(rule, want) {
				t.Errorf("polkit rule lacks %s:\n%s", want, rule)
			}
		}
		if !ev.Security.Polkit.Enable {
			t.Errorf("polkit is not enabled")
		}
		providers, _ := get(ev.Grafana, "provision", "dashboards", "settings", "providers").([]any)
		rules, _ := get(ev.Prometheus, "ruleFiles").([]any)
		jobs, _ := get(ev.Prometheus, "scrapeConfigs").([]any)
		if len(providers) != 0 || len(rules) != 0 || len(jobs) != 0 {
			t.Errorf("Grafana or Prometheus configured on a host without them: %v %v", ev.Grafana, ev.Prometheus)
		}
		f := checkSettingsParse(t, ev.Settings)
		if f.Limits.MemoryMax != "2G" || f.Limits.TasksMax != 256 || f.Limits.CPUQuota != "200%" {
			t.Errorf("default limits = %+v, want klbr-core's defaults", f.Limits)
		}
	})

	t.Run("discord without a token file is refused", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; discord.enable = true; }; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "services.klbr.discord.tokenFile must be set") {
			t.Fatalf("failed assertions = %q, want the tokenFile one", ev.FailedAssertions)
		}
	})

	t.Run("discord with a token file", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; discord = { enable = true; tokenFile = "/run/secrets/discord"; }; }; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Fatalf("failed assertions: %q", ev.FailedAssertions)
		}
		d := ev.Systemd.Services["klbr-discord"]
		if !slices.Equal(strList(d["wantedBy"]), []string{"multi-user.target"}) {
			t.Errorf("klbr-discord wantedBy = %v", d["wantedBy"])
		}
		if got := strList(get(d, "serviceConfig", "LoadCredential")); !slices.Equal(got, []string{"", "discord-token:/run/secrets/discord"}) {
			t.Errorf("LoadCredential = %q, want the shipped one reset, then discord-token from tokenFile", got)
		}
		// systemctl reload klbr-discord: the shipped /bin/kill (none on
		// NixOS) replaced by coreutils' kill sending SIGHUP.
		if rl := strList(get(d, "serviceConfig", "ExecReload")); len(rl) != 2 || rl[0] != "" || !strings.HasSuffix(rl[1], "-coreutils/bin/kill -HUP $MAINPID") {
			t.Errorf("klbr-discord.service ExecReload = %q, want the shipped one replaced by coreutils' kill -HUP $MAINPID", rl)
		}
		if get(d, "serviceConfig", "DynamicUser") != true || !slices.Equal(strList(get(d, "serviceConfig", "SupplementaryGroups")), []string{"klbr-ingress"}) {
			t.Errorf("klbr-discord serviceConfig = %v, want a dynamic user in the ingress group", d["serviceConfig"])
		}
		if f := checkSettingsParse(t, ev.Settings); !f.Discord.Enabled || f.Discord.TokenFile != "" {
			t.Errorf("settings.discord = %+v, want enabled, with the token from the credential", f.Discord)
		}
	})

	t.Run("a token file in the Nix store is refused", func(t *testing.T) {
		ev, errText := evalModule(t, ni, lib, `{ services.klbr = { enable = true; discord = { enable = true; tokenFile = "/nix/store/22222222222222222222222222222222-token"; }; }; }`)
		if ev != nil || !strings.Contains(errText, "tokenFile") {
			t.Fatalf("a world-readable token file was accepted: %v\n%s", ev, errText)
		}
	})

	t.Run("no secret file in the Nix store", func(t *testing.T) {
		// A string under /nix/store, and a Nix path literal (copied into the
		// store when klbr.toml is written), in each secret key of
		// klbr.toml: each is named in one failed assertion.
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; settings = {
			routes.main = { url = "http://localhost:8001/v1"; model = "m"; api_key_file = "/nix/store/33333333333333333333333333333333-key"; };
			discord.token_file = ./module_test.go;
			hosts.gpu = { ssh = "klbr@gpu"; identity_file = "/nix/store/44444444444444444444444444444444-id"; known_hosts_file = "/nix/store/55555555555555555555555555555555-known"; };
		}; }; }`)
		if len(ev.FailedAssertions) != 1 {
			t.Fatalf("failed assertions = %q, want the one for secrets in the store", ev.FailedAssertions)
		}
		msg := ev.FailedAssertions[0]
		for _, want := range []string{"services.klbr.settings.routes.main.api_key_file", "services.klbr.settings.discord.token_file",
			"services.klbr.settings.hosts.gpu.identity_file", "Nix store"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the assertion does not name %s:\n%s", want, msg)
			}
		}
		if strings.Contains(msg, "known_hosts_file") {
			t.Errorf("a host's public key is not a secret, but the assertion names it:\n%s", msg)
		}
		// Secrets outside the store pass.
		ev = mustEval(t, ni, lib, `{ services.klbr = { enable = true; settings = {
			routes.main = { url = "http://localhost:8001/v1"; model = "m"; api_key_file = "/run/credentials/klbr-core.service/key"; };
			hosts.gpu = { ssh = "klbr@gpu"; identity_file = "/run/secrets/id"; known_hosts_file = "/nix/store/55555555555555555555555555555555-known"; };
		}; }; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Errorf("failed assertions for secrets outside the store: %q", ev.FailedAssertions)
		}
	})

	t.Run("limits are checked", func(t *testing.T) {
		for _, bad := range []string{`memory_max = "2 GB"`, `tasks_max = 0`, `cpu_quota = "2"`} {
			ev, errText := evalModule(t, ni, lib, `{ services.klbr = { enable = true; settings.limits.`+bad+`; }; }`)
			if ev != nil || !strings.Contains(errText, "limits") {
				t.Errorf("limits.%s was accepted: %v\n%s", bad, ev, errText)
			}
		}
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; settings.limits = { memory_max = "512M"; tasks_max = 64; }; }; }`)
		f := checkSettingsParse(t, ev.Settings)
		if f.Limits.MemoryMax != "512M" || f.Limits.TasksMax != 64 || f.Limits.CPUQuota != "200%" {
			t.Errorf("limits = %+v", f.Limits)
		}
	})

	t.Run("the documented example settings parse", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; settings = {
			agent.route = "main";
			routes.main = { url = "http://localhost:8001/v1"; model = "local"; api_key_file = "/run/credentials/klbr-core.service/openai-key"; };
			limits = { memory_max = "4G"; tasks_max = 512; cpu_quota = "200%"; };
		}; credentials.openai-key = "/run/secrets/openai-key"; }; }`)
		f := checkSettingsParse(t, ev.Settings)
		if r, ok := f.AgentRoute(); !ok || r.Model != "local" {
			t.Errorf("agent route = %+v, %v", r, ok)
		}
		if got := strList(get(ev.Systemd.Services["klbr-core"], "serviceConfig", "LoadCredential")); !slices.Equal(got, []string{"openai-key:/run/secrets/openai-key"}) {
			t.Errorf("LoadCredential = %q", got)
		}
	})

	t.Run("credential names are checked", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; credentials."a:b" = "/run/secrets/x"; }; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "credentials") {
			t.Fatalf("failed assertions = %q", ev.FailedAssertions)
		}
	})

	t.Run("another user", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; user = "agent"; group = "agent"; }; }`)
		if _, ok := ev.Users.Users["klbr"]; ok {
			t.Errorf("the klbr user is created though user = agent")
		}
		if !strings.Contains(ev.Security.Polkit.ExtraConfig, `subject.user == "agent"`) {
			t.Errorf("polkit rule is not for the configured user:\n%s", ev.Security.Polkit.ExtraConfig)
		}
		if get(ev.Systemd.Services["klbr-core"], "serviceConfig", "User") != "agent" {
			t.Errorf("serviceConfig = %v", ev.Systemd.Services["klbr-core"]["serviceConfig"])
		}
	})

	t.Run("grafana and prometheus", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; grafana.enable = true; prometheus.enable = true; }; }`)
		providers, _ := get(ev.Grafana, "provision", "dashboards", "settings", "providers").([]any)
		if len(providers) != 1 {
			t.Fatalf("grafana providers = %v", get(ev.Grafana, "provision"))
		}
		p, _ := providers[0].(map[string]any)
		if got := get(p, "options", "path"); got != "/nix/store/11111111111111111111111111111111-klbr/share/klbr/grafana" {
			t.Errorf("dashboard path = %v, want the package's share/klbr/grafana", got)
		}
		if get(ev.Grafana, "provision", "enable") != true {
			t.Errorf("provisioning is not enabled: %v", get(ev.Grafana, "provision"))
		}
		jobs, _ := get(ev.Prometheus, "scrapeConfigs").([]any)
		if len(jobs) != 1 || !strings.Contains(mustJSON(t, jobs[0]), `"127.0.0.1:8765"`) {
			t.Errorf("scrapeConfigs = %v", jobs)
		}
		rules, _ := get(ev.Prometheus, "ruleFiles").([]any)
		if len(rules) != 1 || rules[0] != "/nix/store/11111111111111111111111111111111-klbr/share/klbr/prometheus/klbr-rules.yml" {
			t.Errorf("ruleFiles = %v, want the package's alert rules", rules)
		}
	})

	t.Run("dashboard and rules follow the host's Grafana and Prometheus", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr.enable = true; services.grafana.enable = true; services.prometheus.enable = true; }`)
		if providers, _ := get(ev.Grafana, "provision", "dashboards", "settings", "providers").([]any); len(providers) != 1 {
			t.Errorf("Grafana is enabled, but no klbr dashboard is provisioned: %v", get(ev.Grafana, "provision"))
		}
		if rules, _ := get(ev.Prometheus, "ruleFiles").([]any); len(rules) != 1 {
			t.Errorf("Prometheus is enabled, but klbr's rules are not installed: %v", ev.Prometheus)
		}
		off := mustEval(t, ni, lib, `{ services.klbr.enable = true; }`)
		if rules, _ := get(off.Prometheus, "ruleFiles").([]any); len(rules) != 0 {
			t.Errorf("rules installed without Prometheus: %v", off.Prometheus)
		}
	})

	t.Run("backup timer", func(t *testing.T) {
		ev := mustEval(t, ni, lib, `{ services.klbr = { enable = true; backup = { enable = true; keep = 3; }; }; }`)
		svc := ev.Systemd.Services["klbr-backup"]
		if svc == nil || get(svc, "startAt") != "daily" || get(svc, "serviceConfig", "User") != "klbr" {
			t.Fatalf("klbr-backup = %v", svc)
		}
		script, _ := get(svc, "script").(string)
		if !strings.Contains(script, "klbr-core backup \"$dest\"") || !strings.Contains(script, "head -n -3") || strings.Contains(script, "--include-secrets") {
			t.Errorf("klbr-backup script:\n%s", script)
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// workerEval is what nix/tests/worker-eval.nix returns.
type workerEval struct {
	Options          []string `json:"options"`
	FailedAssertions []string `json:"failedAssertions"`
	Environment      struct {
		SystemPackages []string `json:"systemPackages"`
	} `json:"environment"`
	Systemd struct {
		Packages []string `json:"packages"`
		User     struct {
			Slices map[string]map[string]any `json:"slices"`
		} `json:"user"`
	} `json:"systemd"`
	Users struct {
		Users  map[string]map[string]any `json:"users"`
		Groups map[string]map[string]any `json:"groups"`
	} `json:"users"`
	Security map[string]any `json:"security"`
	OpenSSH  map[string]any `json:"openssh"`
}

func evalWorker(t *testing.T, nixInstantiate, lib, cfg string) (*workerEval, string) {
	t.Helper()
	harness := filepath.Join(repoRoot(t), "nix", "tests", "worker-eval.nix")
	expr := "import " + harness + " { lib = import " + lib + "; config = " + cfg + "; }"
	cmd := exec.Command(nixInstantiate, "--eval", "--strict", "--json", "-E", expr)
	cmd.Env = nixEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String()
	}
	var ev workerEval
	if err := json.Unmarshal(stdout.Bytes(), &ev); err != nil {
		t.Fatalf("decode the evaluation: %v", err)
	}
	return &ev, ""
}

// TestWorkerModuleEvaluates runs lib.evalModules over nix/worker.nix
// (services.klbr-worker, the flake's nixosModules.worker).
func TestWorkerModuleEvaluates(t *testing.T) {
	lib := nixpkgsLib(t)
	ni := requireTool(t, "nix-instantiate", "nix-bin")
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKlbrKlbrKlbrKlbrKlbrKlbrKlbrKlbrKlbrKlbrKlbr klbr-core"
	mustWorker := func(cfg string) *workerEval {
		t.Helper()
		ev, errText := evalWorker(t, ni, lib, cfg)
		if ev == nil {
			t.Fatalf("evaluating the worker module with %s failed:\n%s", cfg, errText)
		}
		return ev
	}

	t.Run("disabled does nothing", func(t *testing.T) {
		ev := mustWorker(`{ }`)
		if len(ev.Systemd.Packages) != 0 || len(ev.Users.Users) != 0 || len(ev.Security) != 0 || len(ev.OpenSSH) != 0 {
			t.Fatalf("a disabled worker module changed the system: %+v", ev)
		}
		want := []string{"services.klbr-worker.authorizedKeys", "services.klbr-worker.enable", "services.klbr-worker.group",
			"services.klbr-worker.home", "services.klbr-worker.openFirewall", "services.klbr-worker.package", "services.klbr-worker.user"}
		if got := slices.Sorted(slices.Values(ev.Options)); !slices.Equal(got, want) {
			t.Fatalf("options:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("enabled with one key", func(t *testing.T) {
		ev := mustWorker(`{ services.klbr-worker = { enable = true; authorizedKeys = [ "` + key + `" ]; }; }`)
		if len(ev.FailedAssertions) != 0 {
			t.Fatalf("failed assertions: %q", ev.FailedAssertions)
		}
		pkg := "/nix/store/11111111111111111111111111111111-klbr"
		if !slices.Equal(ev.Systemd.Packages, []string{pkg}) || !slices.Contains(ev.Environment.SystemPackages, pkg) {
			t.Errorf("the package (klbr-kernel, the runtime, klbr.slice) is not installed: %q %q", ev.Systemd.Packages, ev.Environment.SystemPackages)
		}
		u := ev.Users.Users["klbr"]
		if get(u, "isSystemUser") != true || get(u, "group") != "klbr" || get(u, "useDefaultShell") != true || get(u, "createHome") != true {
			t.Errorf("users.users.klbr = %v, want an unprivileged system user with a shell and a home", u)
		}
		if keys := strList(get(u, "openssh", "authorizedKeys", "keys")); !slices.Equal(keys, []string{key}) {
			t.Errorf("authorized keys = %q, want klbr-core's", keys)
		}
		if _, ok := ev.Users.Groups["klbr"]; !ok {
			t.Errorf("group klbr is not created: %v", ev.Users.Groups)
		}
		if ev.OpenSSH["enable"] != true {
			t.Errorf("services.openssh = %v, want enabled", ev.OpenSSH)
		}
		// The jobs are units of the login's own user manager, which
		// lingers; nothing of the system's security (no polkit rule: one
		// for klbr-* units would make klbr-core's key the host's root).
		if get(u, "linger") != true {
			t.Errorf("users.users.klbr = %v, want it lingering", u)
		}
		if len(ev.Security) != 0 {
			t.Errorf("security = %v, want nothing (no polkit rule)", ev.Security)
		}
		if sl := ev.Systemd.User.Slices["klbr"]; sl == nil || get(sl, "sliceConfig", "MemoryAccounting") != true {
			t.Errorf("systemd.user.slices.klbr = %v, want the user manager's klbr.slice", sl)
		}
	})

	t.Run("no key, or root, is refused", func(t *testing.T) {
		ev := mustWorker(`{ services.klbr-worker.enable = true; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "authorizedKeys is empty") {
			t.Fatalf("failed assertions = %q, want the empty-keys one", ev.FailedAssertions)
		}
		ev = mustWorker(`{ services.klbr-worker = { enable = true; user = "root"; authorizedKeys = [ "` + key + `" ]; }; }`)
		if len(ev.FailedAssertions) != 1 || !strings.Contains(ev.FailedAssertions[0], "must not be root") {
			t.Fatalf("failed assertions = %q, want the root one", ev.FailedAssertions)
		}
	})

	t.Run("another user gets the key and lingers", func(t *testing.T) {
		ev := mustWorker(`{ services.klbr-worker = { enable = true; user = "builder"; authorizedKeys = [ "` + key + `" ]; }; }`)
		if get(ev.Users.Users["builder"], "isSystemUser") != nil {
			t.Errorf("an existing user was redefined: %v", ev.Users.Users["builder"])
		}
		if keys := strList(get(ev.Users.Users["builder"], "openssh", "authorizedKeys", "keys")); !slices.Equal(keys, []string{key}) {
			t.Errorf("builder's keys = %q", keys)
		}
		if _, ok := ev.Users.Users["klbr"]; ok {
			t.Errorf("the klbr user is created though user = builder")
		}
		if get(ev.Users.Users["builder"], "linger") != true {
			t.Errorf("builder does not linger: %v", ev.Users.Users["builder"])
		}
	})
}
