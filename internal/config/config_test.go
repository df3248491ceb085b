package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
)

// envMap returns a lookup func over m, standing in for os.LookupEnv.
func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// withEnv returns base with the pairs of kv added.
func withEnv(base map[string]string, kv ...string) map[string]string {
	m := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func getwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestLoadDefaults(t *testing.T) {
	home := t.TempDir()
	wd := getwd(t)
	cfg, err := Load(envMap(map[string]string{"HOME": home}))
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(home, ".local", "share", "klbr")
	want := Paths{
		Workspace:     wd,
		DataDir:       data,
		ConfigFile:    filepath.Join(data, "klbr.toml"),
		ControlSocket: filepath.Join(data, "control.sock"),
		IngressSocket: filepath.Join(data, "ingress.sock"),
		Python:        "python3",
	}
	if cfg.Paths != want {
		t.Errorf("Paths:\n got %+v\nwant %+v", cfg.Paths, want)
	}
	if cfg.BindAddr != "127.0.0.1:8765" {
		t.Errorf("BindAddr = %q", cfg.BindAddr)
	}
	if cfg.FileLoaded {
		t.Error("FileLoaded = true without a file")
	}
	wantFile := Defaults()
	wantFile.applySeed(cfg.Paths.ConfigFile) // no route configured: the seed's (seed_test.go)
	if !reflect.DeepEqual(cfg.File, wantFile) {
		t.Errorf("File = %+v, want Defaults() with the seed routes", cfg.File)
	}
}

func TestLoadDataDir(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"HOME", map[string]string{"HOME": "/home/u"}, "/home/u/.local/share/klbr", ""},
		{"XDG_DATA_HOME", map[string]string{"HOME": "/home/u", "XDG_DATA_HOME": "/xdg"}, "/xdg/klbr", ""},
		{"relative XDG_DATA_HOME is ignored", map[string]string{"HOME": "/home/u", "XDG_DATA_HOME": "xdg"}, "/home/u/.local/share/klbr", ""},
		{"STATE_DIRECTORY", map[string]string{"HOME": "/home/u", "XDG_DATA_HOME": "/xdg", "STATE_DIRECTORY": "/var/lib/klbr"}, "/var/lib/klbr", ""},
		{"STATE_DIRECTORY first entry", map[string]string{"STATE_DIRECTORY": "/var/lib/klbr:/var/lib/other"}, "/var/lib/klbr", ""},
		{"KLBR_DATA_DIR wins", map[string]string{"HOME": "/home/u", "STATE_DIRECTORY": "/var/lib/klbr", "KLBR_DATA_DIR": "/data"}, "/data", ""},
		{"empty KLBR_DATA_DIR is unset", map[string]string{"HOME": "/home/u", "KLBR_DATA_DIR": ""}, "/home/u/.local/share/klbr", ""},
		{"nothing set", map[string]string{}, "", "set KLBR_DATA_DIR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(envMap(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Paths.DataDir != tt.want {
				t.Errorf("DataDir = %q, want %q", cfg.Paths.DataDir, tt.want)
			}
			if want := filepath.Join(tt.want, "control.sock"); cfg.Paths.ControlSocket != want {
				t.Errorf("ControlSocket = %q, want %q", cfg.Paths.ControlSocket, want)
			}
		})
	}
}

func TestLoadEnvOverrides(t *testing.T) {
	base := map[string]string{"HOME": "/home/u"}
	dataDefault := "/home/u/.local/share/klbr"
	tests := []struct {
		name string
		env  map[string]string
		get  func(*Config) string
		want string
	}{
		{"KLBR_WORKSPACE", withEnv(base, "KLBR_WORKSPACE", "/ws"), func(c *Config) string { return c.Paths.Workspace }, "/ws"},
		{"KLBR_DATA_DIR", withEnv(base, "KLBR_DATA_DIR", "/d"), func(c *Config) string { return c.Paths.DataDir }, "/d"},
		{"KLBR_DATA_DIR moves the config", withEnv(base, "KLBR_DATA_DIR", "/d"), func(c *Config) string { return c.Paths.ConfigFile }, "/d/klbr.toml"},
		{"KLBR_DATA_DIR moves the ingress socket", withEnv(base, "KLBR_DATA_DIR", "/d"), func(c *Config) string { return c.Paths.IngressSocket }, "/d/ingress.sock"},
		{"KLBR_CONTROL_SOCKET", withEnv(base, "KLBR_CONTROL_SOCKET", "/run/klbr/c.sock"), func(c *Config) string { return c.Paths.ControlSocket }, "/run/klbr/c.sock"},
		{"KLBR_INGRESS_SOCKET", withEnv(base, "KLBR_INGRESS_SOCKET", "/run/klbr/i.sock"), func(c *Config) string { return c.Paths.IngressSocket }, "/run/klbr/i.sock"},
		{"KLBR_BEHAVIOR_DIR", withEnv(base, "KLBR_BEHAVIOR_DIR", "/src/behavior"), func(c *Config) string { return c.Paths.BehaviorDir }, "/src/behavior"},
		{"KLBR_RUNTIME_DIR", withEnv(base, "KLBR_RUNTIME_DIR", "/src/python/klbr-runtime"), func(c *Config) string { return c.Paths.RuntimeDir }, "/src/python/klbr-runtime"},
		{"KLBR_PYTHON", withEnv(base, "KLBR_PYTHON", "python3.12"), func(c *Config) string { return c.Paths.Python }, "python3.12"},
		{"KLBR_BIND_ADDR", withEnv(base, "KLBR_BIND_ADDR", "[::1]:9000"), func(c *Config) string { return c.BindAddr }, "[::1]:9000"},
		{"paths are cleaned", withEnv(base, "KLBR_DATA_DIR", "/d/./x/../y/"), func(c *Config) string { return c.Paths.DataDir }, "/d/y"},
		{"unset behavior dir stays empty", base, func(c *Config) string { return c.Paths.BehaviorDir }, ""},
		{"unset runtime dir stays empty", base, func(c *Config) string { return c.Paths.RuntimeDir }, ""},
		{"default config", base, func(c *Config) string { return c.Paths.ConfigFile }, dataDefault + "/klbr.toml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(envMap(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(cfg); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadRelativePaths(t *testing.T) {
	wd := getwd(t)
	env := map[string]string{
		"HOME":                "/home/u",
		"KLBR_WORKSPACE":      "ws",
		"KLBR_DATA_DIR":       "./state",
		"KLBR_CONTROL_SOCKET": "run/c.sock",
		"KLBR_INGRESS_SOCKET": "run/i.sock",
		"KLBR_BEHAVIOR_DIR":   "../behavior",
		"KLBR_RUNTIME_DIR":    "python/klbr-runtime",
		"KLBR_PYTHON":         "venv/bin/python",
	}
	cfg, err := Load(envMap(env))
	if err != nil {
		t.Fatal(err)
	}
	want := Paths{
		Workspace:     filepath.Join(wd, "ws"),
		DataDir:       filepath.Join(wd, "state"),
		ConfigFile:    filepath.Join(wd, "state", "klbr.toml"),
		ControlSocket: filepath.Join(wd, "run", "c.sock"),
		IngressSocket: filepath.Join(wd, "run", "i.sock"),
		BehaviorDir:   filepath.Join(filepath.Dir(wd), "behavior"),
		RuntimeDir:    filepath.Join(wd, "python", "klbr-runtime"),
		Python:        "venv/bin/python", // as given: ResolvePython resolves it
	}
	if cfg.Paths != want {
		t.Errorf("Paths:\n got %+v\nwant %+v", cfg.Paths, want)
	}

	t.Run("KLBR_CONFIG", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		if err := os.WriteFile("my.toml", []byte("[agent]\nroute = \"x\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(envMap(map[string]string{"HOME": "/home/u", "KLBR_CONFIG": "my.toml"}))
		if err != nil {
			t.Fatal(err)
		}
		// t.TempDir may sit below a symlink; compare with the cwd as Go sees it.
		if want := filepath.Join(getwd(t), "my.toml"); cfg.Paths.ConfigFile != want {
			t.Errorf("ConfigFile = %q, want %q", cfg.Paths.ConfigFile, want)
		}
		if !cfg.FileLoaded || cfg.File.Agent.Route != "x" {
			t.Errorf("file not read: loaded=%v route=%q", cfg.FileLoaded, cfg.File.Agent.Route)
		}
	})
}

func TestLoadConfigFile(t *testing.T) {
	const valid = "[routes.main]\nurl = \"http://localhost:8001/v1\"\nmodel = \"local\"\n"
	tests := []struct {
		name       string
		explicit   bool   // name the file through KLBR_CONFIG
		content    string // written unless missing
		missing    bool
		dir        bool // make the config path a directory
		wantLoaded bool
		wantErr    string
		wantLine   int // of the *Error, when wantErr is set and the file is wrong
	}{
		{name: "default missing is fine", missing: true},
		{name: "default present", content: valid, wantLoaded: true},
		{name: "explicit present", explicit: true, content: valid, wantLoaded: true},
		{name: "explicit missing is an error", explicit: true, missing: true, wantErr: "(named by KLBR_CONFIG) does not exist"},
		{name: "empty file", content: "", wantLoaded: true},
		{name: "invalid file", content: valid + "timeout_seconds = 0\n", wantErr: "routes.main.timeout_seconds: 0 is out of range", wantLine: 4},
		{name: "directory", dir: true, wantErr: "read config file"},
		{name: "too large", content: valid + "#" + strings.Repeat("x", maxFileSize) + "\n", wantErr: "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := t.TempDir()
			path := filepath.Join(data, "klbr.toml")
			env := map[string]string{"HOME": "/home/u", "KLBR_DATA_DIR": data}
			if tt.explicit {
				path = filepath.Join(t.TempDir(), "elsewhere.toml")
				env["KLBR_CONFIG"] = path
			}
			switch {
			case tt.dir:
				if err := os.Mkdir(path, 0o700); err != nil {
					t.Fatal(err)
				}
			case !tt.missing:
				if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := Load(envMap(env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				if tt.wantLine > 0 {
					errs := Errors(err)
					if len(errs) != 1 || errs[0].File != path || errs[0].Line != tt.wantLine {
						t.Fatalf("errors = %#v, want one at %s:%d", errs, path, tt.wantLine)
					}
					if !strings.HasPrefix(err.Error(), path+":") {
						t.Errorf("error %q does not start with the file's path", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.FileLoaded != tt.wantLoaded {
				t.Errorf("FileLoaded = %v, want %v", cfg.FileLoaded, tt.wantLoaded)
			}
			if cfg.Paths.ConfigFile != path {
				t.Errorf("ConfigFile = %q, want %q", cfg.Paths.ConfigFile, path)
			}
			if tt.wantLoaded && tt.content == valid && cfg.File.Routes["main"].Model != "local" {
				t.Errorf("routes not read: %+v", cfg.File.Routes)
			}
		})
	}
}

func TestLoadRefuses(t *testing.T) {
	long := "/" + strings.Repeat("d", 100)
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
		wantIs  error
	}{
		{"non-loopback bind address", map[string]string{"HOME": "/h", "KLBR_BIND_ADDR": "0.0.0.0:8765"}, "KLBR_BIND_ADDR", ErrNotLoopback},
		{"bind address without a port", map[string]string{"HOME": "/h", "KLBR_BIND_ADDR": "127.0.0.1"}, "KLBR_BIND_ADDR", nil},
		{"socket path too long", map[string]string{"KLBR_DATA_DIR": long}, "set KLBR_CONTROL_SOCKET (or KLBR_DATA_DIR) to a shorter path", nil},
		{"explicit socket path too long", map[string]string{"HOME": "/h", "KLBR_INGRESS_SOCKET": long + "/i.sock"}, "set KLBR_INGRESS_SOCKET", nil},
		{"the same path for both sockets", map[string]string{"HOME": "/h", "KLBR_CONTROL_SOCKET": "/run/k.sock", "KLBR_INGRESS_SOCKET": "/run/k.sock"}, "are the same path", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(envMap(tt.env))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.wantIs)
			}
		})
	}
}

// base is a valid route on lines 1-3, for error cases to add lines to.
const base = "[routes.main]\nurl = \"http://localhost:8001/v1\"\nmodel = \"local\"\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		line int
		col  int // 0: not checked
		key  string
		msg  string // a substring of Msg
	}{
		// From go-toml's strict decoder.
		{"syntax error", "[agent]\nroute = \n", 2, 9, "", "unexpected character"},
		{"unterminated string", base + "api_key_env = \"X\n", 4, 0, "", "string"},
		{"unknown table", "[agnet]\nroute = \"main\"\n", 1, 2, "agnet", `unknown key (did you mean "agent"?)`},
		{"unknown route key", base + "modle = \"x\"\n", 4, 1, "routes.main.modle", `unknown key (did you mean "routes.main.model"?)`},
		{"unknown key in inline table, a typo", "discord = { enabled = true, chanels = [] }\n", 1, 29, "discord.chanels", `unknown key (did you mean "discord.channels"?)`},
		{"unknown key in inline table", "discord = { enabled = true, colour = \"red\" }\n", 1, 29, "discord.colour", "unknown key"},
		{"unknown key under limits", "[limits]\nmemory_high = \"1G\"\n", 2, 1, "limits.memory_high", "unknown key"},
		{"key in the wrong case", "[routes.main]\nURL = \"http://x\"\nmodel = \"m\"\n", 2, 1, "routes.main.URL", `did you mean "url"?`},
		{"table in the wrong case", "[Discord]\nenabled = true\n", 1, 2, "Discord", `did you mean "discord"?`},
		{"type mismatch", base + "timeout_seconds = \"120\"\n", 4, 19, "routes.main.timeout_seconds", "expected an integer, not a TOML string"},
		{"bool mismatch", "[discord]\nenabled = \"yes\"\n", 2, 11, "discord.enabled", "expected a boolean, not a TOML string"},
		{"array element mismatch", "[discord]\nchannels = [\n  \"1\",\n  2,\n]\n", 4, 3, "discord.channels", "expected a string, not a TOML integer"},
		{"table where a string goes", base + "[routes.main.model]\nx = 1\n", 4, 0, "", "model"},
		{"duplicate key", base + "model = \"again\"\n", 4, 1, "", "already defined"},
		{"integer overflow", base + "timeout_seconds = 99999999999999999999\n", 4, 19, "", "too large"},
		{"array of tables", "[[routes]]\nurl = \"http://x\"\n", 1, 0, "routes", "array table"},
		{"extra_options not a table", base + "extra_options = 5\n", 4, 17, "routes.main.extra_options", "expected a table, not a TOML integer"},

		// retention
		{"retention.history_days negative", base + "\n[retention]\nhistory_days = -1\n", 6, 1, "retention.history_days", "-1 is negative; 0 keeps every original"},

		// agent
		{"agent.route names no route", "[agent]\nroute = \"other\"\n\n" + base, 2, 1, "agent.route", `no [routes.other] is defined (routes: main)`},
		{"default agent.route names no route", "[routes.work]\nurl = \"http://x\"\nmodel = \"m\"\n", 1, 2, "agent.route", `defaults to "main", but no [routes.main] is defined (routes: work)`},
		{"default agent.route with an [agent] table", "[agent]\n\n[routes.work]\nurl = \"http://x\"\nmodel = \"m\"\n", 1, 2, "agent.route", "set route in [agent]"},
		{"agent.route not a name", "[agent]\nroute = \"Main\"\n", 2, 1, "agent.route", "not a route name"},
		{"agent.route empty", "[agent]\nroute = \"\"\n", 2, 1, "agent.route", "not a route name"},

		// routes
		{"route name", base + "[routes.\"a.b\"]\nurl = \"http://x\"\nmodel = \"m\"\n", 4, 9, `routes."a.b"`, "route names are lowercase"},
		{"url missing", "[routes.main]\nmodel = \"m\"\n", 1, 9, "routes.main.url", "required"},
		{"url scheme", "[routes.main]\nurl = \"ftp://x/v1\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "not an http or https URL"},
		{"url without scheme", "[routes.main]\nurl = \"localhost:8001/v1\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "not an http or https URL"},
		{"url without host", "[routes.main]\nurl = \"http:///v1\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "has no host"},
		{"url with credentials", "[routes.main]\nurl = \"https://me:secret@api.example/v1\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "must not carry credentials"},
		{"url unparsable", "[routes.main]\nurl = \"http://[::1/v1\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "is not a URL"},
		{"url empty", "[routes.main]\nurl = \"\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", "required"},
		{"model missing", "[routes.main]\nurl = \"http://x\"\n", 1, 9, "routes.main.model", "required"},
		{"model blank", "[routes.main]\nurl = \"http://x\"\nmodel = \"  \"\n", 3, 1, "routes.main.model", "must not be empty"},
		{"api_key_env", base + "api_key_env = \"openai_key\"\n", 4, 1, "routes.main.api_key_env", "not an environment variable name"},
		{"api_key_env leading digit", base + "api_key_env = \"1KEY\"\n", 4, 1, "routes.main.api_key_env", "not an environment variable name"},
		{"api_key_file relative", base + "api_key_file = \"secrets/key\"\n", 4, 1, "routes.main.api_key_file", "not an absolute path"},
		{"api_key_env and api_key_file", base + "api_key_env = \"KEY\"\napi_key_file = \"/run/credentials/key\"\n", 5, 1, "routes.main.api_key_file", "not both"},
		{"cache_profile unknown", base + "cache_profile = \"anthropic\"\n", 4, 1, "routes.main.cache_profile", `"anthropic" is not a cache profile`},
		{"cache_affinity without a profile", base + "cache_affinity = \"klbr:work\"\n", 4, 1, "routes.main.cache_affinity", "needs a cache_profile"},
		{"cache_affinity empty", base + "cache_profile = \"openai_prompt_cache_key\"\ncache_affinity = \"\"\n", 5, 1, "routes.main.cache_affinity", "must not be empty"},
		{"cache_affinity too long", base + "cache_profile = \"openai_prompt_cache_key\"\ncache_affinity = \"" + strings.Repeat("a", 65) + "\"\n", 5, 1, "routes.main.cache_affinity", "65 characters long; at most 64"},
		{"cache_retention without a profile", base + "cache_retention = \"24h\"\n", 4, 1, "routes.main.cache_retention", "needs a cache_profile"},
		{"max_steps zero", "[agent]\nmax_steps = 0\n", 2, 1, "agent.max_steps", "0 is out of range 1..10000"},
		{"context budget negative", "[agent]\nroute = \"main\"\ncontext_budget_tokens = -5\n", 3, 1, "agent.context_budget_tokens", "out of range"},
		{"retry backoff too long", "[agent]\nretry_backoff_ms = 7200000\n", 2, 1, "agent.retry_backoff_ms", "out of range"},
		{"retry backoff cap zero", "[agent]\nmax_retry_backoff_ms = 0\n", 2, 1, "agent.max_retry_backoff_ms", "0 is out of range"},
		{"retry backoff cap below the first backoff", "[agent]\nretry_backoff_ms = 5000\nmax_retry_backoff_ms = 1000\n", 3, 1, "agent.max_retry_backoff_ms", "less than agent.retry_backoff_ms (5000)"},
		{"cache_retention on the key profile", base + "cache_profile = \"openai_prompt_cache_key\"\ncache_retention = \"24h\"\n", 5, 1, "routes.main.cache_retention", `"24h" is not accepted by cache_profile "openai_prompt_cache_key" (it accepts none)`},
		{"30m on the retention profile", base + "cache_profile = \"openai_prompt_cache_retention\"\ncache_retention = \"30m\"\n", 5, 1, "routes.main.cache_retention", "(it accepts in_memory, 24h)"},
		{"unknown retention on the options profile", base + "cache_profile = \"openai_prompt_cache_options\"\ncache_retention = \"1h\"\n", 5, 1, "routes.main.cache_retention", "(it accepts in_memory, 24h, 30m)"},
		{"timeout zero", base + "timeout_seconds = 0\n", 4, 1, "routes.main.timeout_seconds", "0 is out of range 1..3600"},
		{"timeout too long", base + "timeout_seconds = 3601\n", 4, 1, "routes.main.timeout_seconds", "3601 is out of range 1..3600"},
		{"extra option not JSON", base + "extra_options = { temperature = nan }\n", 4, 19, "routes.main.extra_options.temperature", "cannot be sent in a JSON request"},
		{"extra option in a table, not JSON", base + "[routes.main.extra_options]\ntop_p = inf\n", 5, 1, "routes.main.extra_options.top_p", "cannot be sent in a JSON request"},
		{"dotted keys", "routes.main.url = \"ftp://x\"\nroutes.main.model = \"m\"\n", 1, 13, "routes.main.url", "not an http or https URL"},
		{"inline tables", "routes = { main = { url = \"ftp://x\", model = \"m\" } }\n", 1, 21, "routes.main.url", "not an http or https URL"},
		{"multi-line inline table", "routes = { main = {\n  model = \"m\",\n  url = \"ftp://x\",\n} }\n", 3, 3, "routes.main.url", "not an http or https URL"},
		{"CRLF line endings", "[routes.main]\r\nurl = \"http://x\"\r\nmodel = \"m\"\r\ntimeout_seconds = 0\r\n", 4, 1, "routes.main.timeout_seconds", "out of range"},
		{"after comments and blank lines", "# klbr\n\n[routes.main] # the local server\n\n# the URL\nurl = \"gopher://x\"\nmodel = \"m\"\n", 6, 1, "routes.main.url", "not an http"},

		{"url names the endpoint", "[routes.main]\nurl = \"http://x:8001/v1/chat/completions\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", `ends in /chat/completions, but url is the API's base URL (klbr adds /chat/completions itself); use "http://x:8001/v1"`},
		{"url names the models list", "[routes.main]\nurl = \"http://x/v1/models/\"\nmodel = \"m\"\n", 2, 1, "routes.main.url", `use "http://x/v1"`},
		{"dialect unknown", base + "dialect = \"anthropic\"\n", 4, 1, "routes.main.dialect", `"anthropic" is not a dialect (one of openai, deepseek, mistral, llama.cpp, vllm, ollama, openrouter)`},
		{"dialect empty", base + "dialect = \"\"\n", 4, 1, "routes.main.dialect", "is not a dialect"},
		{"stream_usage not a bool", base + "stream_usage = \"no\"\n", 4, 16, "routes.main.stream_usage", "expected a boolean"},
		{"fallback names no route", "[agent]\nfallback = [\"local\"]\n\n" + base, 2, 13, "agent.fallback[0]", "no [routes.local] is defined"},
		{"fallback is the agent route", "[agent]\nfallback = [\"main\"]\n\n" + base, 2, 13, "agent.fallback[0]", "is agent.route itself"},
		{"fallback twice", "[agent]\nfallback = [\"b\", \"b\"]\n\n" + base + "[routes.b]\nurl = \"http://y/v1\"\nmodel = \"m\"\n", 2, 18, "agent.fallback[1]", "listed twice"},

		// discord
		{"api_base not a URL", "[discord]\napi_base = \"discord.com\"\n", 2, 1, "discord.api_base", "not an http or https URL"},
		{"api_base empty", "[discord]\napi_base = \"\"\n", 2, 1, "discord.api_base", "required"},
		{"token_file relative", "[discord]\ntoken_file = \"token\"\n", 2, 1, "discord.token_file", "not an absolute path"},
		{"channel not digits", "[discord]\nchannels = [\n  \"123\",\n  \"general\",\n]\n", 4, 3, "discord.channels[1]", `"general" is not a channel id`},
		{"channel empty", "[discord]\nchannels = [\"\"]\n", 2, 13, "discord.channels[0]", "not a channel id"},
		{"ingest", "[discord]\ningest = \"mentions\"\n", 2, 1, "discord.ingest", `"mentions" is not an ingest mode (all or directed)`},
		{"ambient batch is refused", "[discord]\nambient_batch_seconds = 8\n", 2, 1, "discord.ambient_batch_seconds", "settings.toml [attention] ambient_defer_seconds"},
		{"ambient batch zero is refused too", "[discord]\nambient_batch_seconds = 0\n", 2, 1, "discord.ambient_batch_seconds", "is not used and is refused"},
		{"pending aging zero", "[discord]\npending_aging_seconds = 0\n", 2, 1, "discord.pending_aging_seconds", "0 is out of range 1..86400"},
		{"pending aging too long", "[discord]\npending_aging_seconds = 86401\n", 2, 1, "discord.pending_aging_seconds", "86401 is out of range 1..86400"},
		{"author burst zero", "[discord]\nauthor_burst = 0\n", 2, 1, "discord.author_burst", "0 is out of range 1..10000"},
		{"channel rate too high", "[discord]\nchannel_per_minute = 100001\n", 2, 1, "discord.channel_per_minute", "100001 is out of range 1..100000"},
		{"operator not an id", "[discord]\noperator_user_id = \"@me\"\n", 2, 1, "discord.operator_user_id", `"@me" is not a Discord user id`},
		{"notify held without operator", "[discord]\nnotify_held = true\n", 2, 1, "discord.notify_held", "operator_user_id is not set"},
		{"attachment pace too slow", "[discord]\nattachment_bytes_per_second = 1024\n", 2, 1, "discord.attachment_bytes_per_second", "1024 is out of range 65536..1099511627776 (0: unpaced)"},
		{"attachment pace past the timeout", "[discord]\nattachment_bytes_per_second = 65536\n", 2, 1, "discord.attachment_bytes_per_second", "takes 400 s, not less than attachment_timeout_seconds (60): raise the rate or the timeout"},

		// limits
		{"memory_max suffix", "[limits]\nmemory_max = \"2GB\"\n", 2, 1, "limits.memory_max", `"2GB" is not a size`},
		{"memory_max lowercase", "[limits]\nmemory_max = \"2g\"\n", 2, 1, "limits.memory_max", "is not a size"},
		{"memory_max zero", "[limits]\nmemory_max = \"0\"\n", 2, 1, "limits.memory_max", "must be more than 0"},
		{"memory_max overflow", "[limits]\nmemory_max = \"99999999999T\"\n", 2, 1, "limits.memory_max", "too large"},
		{"tasks_max zero", "[limits]\ntasks_max = 0\n", 2, 1, "limits.tasks_max", "0 is out of range 1..100000"},
		{"agents depth too deep", "[agents]\nmax_depth = 17\n", 2, 1, "agents.max_depth", "17 is out of range 1..16"},
		{"agents concurrency too high", "[agents]\nmax_concurrent = 65\n", 2, 1, "agents.max_concurrent", "65 is out of range 1..64"},
		{"agents descendants negative", "[agents]\nmax_descendants = -1\n", 2, 1, "agents.max_descendants", "-1 is out of range 1..10000"},
		{"agents tree tokens negative", "[agents]\nmax_tree_tokens = -1\n", 2, 1, "agents.max_tree_tokens", "-1 is out of range 1..1000000000000"},
		{"agents tree tokens too many", "[agents]\nmax_tree_tokens = 1000000000001\n", 2, 1, "agents.max_tree_tokens", "out of range"},
		{"agents spawns per day negative", "[agents]\nmax_spawns_per_day = -1\n", 2, 1, "agents.max_spawns_per_day", "-1 is out of range 0..100000"},
		{"agents spawns per tree too many", "[agents]\nmax_spawns_per_tree = 100001\n", 2, 1, "agents.max_spawns_per_tree", "out of range"},
		{"agents child wall too long", "[agents]\nmax_child_wall_seconds = 31622401\n", 2, 1, "agents.max_child_wall_seconds", "31622401 is out of range 1..31622400"},
		{"agents one model slot", "[agents]\nmodel_slots = 1\n", 2, 1, "agents.model_slots", "1 is out of range 2..256: one slot is kept for roots"},
		{"agents too many model slots", "[agents]\nmodel_slots = 257\n", 2, 1, "agents.model_slots", "out of range 2..256"},
		{"tasks_max too many", "[limits]\ntasks_max = 100001\n", 2, 1, "limits.tasks_max", "out of range"},
		{"cookie_days zero", "[browser]\ncookie_days = 0\n", 2, 1, "browser.cookie_days", "0 is out of range 1..3650"},
		{"cookie_days too many", "[browser]\ncookie_days = 3651\n", 2, 1, "browser.cookie_days", "out of range"},
		{"cpu_quota without %", "[limits]\ncpu_quota = \"200\"\n", 2, 1, "limits.cpu_quota", "is not a CPU quota"},
		{"cpu_quota fraction", "[limits]\ncpu_quota = \"1.5%\"\n", 2, 1, "limits.cpu_quota", "is not a CPU quota"},
		{"cpu_quota zero", "[limits]\ncpu_quota = \"0%\"\n", 2, 1, "limits.cpu_quota", "must be more than 0%"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("klbr.toml", []byte(tt.doc))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			errs := Errors(err)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), err)
			}
			e := errs[0]
			var asErr *Error
			if !errors.As(err, &asErr) || asErr != e {
				t.Errorf("errors.As does not find the *Error")
			}
			if e.File != "klbr.toml" || e.Line != tt.line || (tt.col != 0 && e.Column != tt.col) {
				t.Errorf("at %s:%d:%d, want klbr.toml:%d:%d (%v)", e.File, e.Line, e.Column, tt.line, tt.col, e)
			}
			if tt.key != "" && e.Key != tt.key {
				t.Errorf("Key = %q, want %q (%v)", e.Key, tt.key, e)
			}
			if !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("Msg = %q, want it to contain %q", e.Msg, tt.msg)
			}
		})
	}
}

func TestParseErrorFormat(t *testing.T) {
	// The example of the design: the error reads as file:line:column: key: message.
	doc := `[agent]
route = "main"

[routes.main]
url = "http://localhost:8001/v1"
model = "local"
cache_retention = "30m"
cache_profile = "openai_prompt_cache_key"
`
	_, err := Parse("klbr.toml", []byte(doc))
	const want = `klbr.toml:7:1: routes.main.cache_retention: "30m" is not accepted by cache_profile "openai_prompt_cache_key" (it accepts none)`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

func TestParseReportsAllErrorsInOrder(t *testing.T) {
	doc := `[routes.b]
url = "ftp://b"
model = "m"

[routes.a]
url = "http://a"
model = "m"
timeout_seconds = 0

[routes.main]
url = "http://x"
modle = "typo"

[limits]
tasks_max = 0
`
	_, err := Parse("k.toml", []byte(doc))
	want := []struct {
		line int
		key  string
	}{
		{2, "routes.b.url"},
		{8, "routes.a.timeout_seconds"},
		{10, "routes.main.model"}, // required, placed at its table
		{12, "routes.main.modle"}, // unknown
		{15, "limits.tasks_max"},
	}
	errs := Errors(err)
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), err)
	}
	for i, w := range want {
		if errs[i].Line != w.line || errs[i].Key != w.key {
			t.Errorf("error %d = %v, want line %d key %s", i, errs[i], w.line, w.key)
		}
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(want) || !strings.HasPrefix(lines[0], "k.toml:2:1: ") {
		t.Errorf("Error() = %q, want one line per error", err)
	}
}

func TestParseCaseVariantsArePlaced(t *testing.T) {
	// go-toml decodes "Ingest" into the ingest field; the key is refused, and
	// the value it carried is still checked at its line.
	_, err := Parse("klbr.toml", []byte("[Discord]\nIngest = \"x\"\n"))
	want := []string{
		`klbr.toml:1:2: Discord: unknown key (keys are case-sensitive: did you mean "discord"?)`,
		`klbr.toml:2:1: discord.Ingest: unknown key (keys are case-sensitive: did you mean "ingest"?)`,
		`klbr.toml:2:1: discord.ingest: "x" is not an ingest mode (all or directed)`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("err = %v\nwant %s", err, strings.Join(want, "\n"))
	}
}

func TestParseDefaults(t *testing.T) {
	t.Run("empty file", func(t *testing.T) {
		f, err := Parse("klbr.toml", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(f, Defaults()) {
			t.Errorf("got %+v, want Defaults()", f)
		}
	})
	t.Run("partial sections keep the other defaults", func(t *testing.T) {
		f, err := Parse("klbr.toml", []byte(base+"[discord]\nenabled = true\nambient_wake = false\n[limits]\ntasks_max = 64\n"))
		if err != nil {
			t.Fatal(err)
		}
		want := Defaults()
		want.Discord.Enabled = true
		want.Discord.AmbientWake = false
		want.Limits.TasksMax = 64
		want.Routes = map[string]Route{"main": {URL: "http://localhost:8001/v1", Model: "local", TimeoutSeconds: 120}}
		if !reflect.DeepEqual(f, want) {
			t.Errorf("got  %+v\nwant %+v", f, want)
		}
	})
	t.Run("agents tree budgets", func(t *testing.T) {
		f, err := Parse("klbr.toml", []byte("[agents]\nmodel_slots = 11\n"))
		if err != nil {
			t.Fatal(err)
		}
		a := f.Agents.Resolved()
		if a.ModelSlots != 11 || a.MaxTreeTokens != DefaultAgentsMaxTreeTokens || a.MaxChildWallSeconds != DefaultAgentsMaxChildWall || a.MaxConcurrent != DefaultAgentsMaxConcurrent {
			t.Errorf("Agents = %+v", a)
		}
		if d := (Agents{}).Resolved(); d.ModelSlots != 4 || d.MaxTreeTokens != 10_000_000 || d.MaxChildWallSeconds != 3600 {
			t.Errorf("defaults %+v", d)
		}
	})
	t.Run("inline discord table keeps the other defaults", func(t *testing.T) {
		f, err := Parse("klbr.toml", []byte("discord = { include_bots = true }\n"))
		if err != nil {
			t.Fatal(err)
		}
		if !f.Discord.IncludeBots || !f.Discord.AmbientWake || f.Discord.APIBase != DefaultDiscordAPIBase || f.Discord.Ingest != IngestAll {
			t.Errorf("Discord = %+v", f.Discord)
		}
	})
}

func TestParseAccepts(t *testing.T) {
	full := `[agent]
route = "work"
max_steps = 12
context_budget_tokens = 5000

[routes.main]
url = "http://localhost:8001/v1"
model = "local"

[routes.work]
url = "https://api.example/v1"
model = "m"
api_key_env = "OPENAI_API_KEY"
cache_profile = "openai_prompt_cache_options"
cache_affinity = "klbr:work"
cache_retention = "30m"
timeout_seconds = 3600
extra_options = { temperature = 0.7, stop = ["\n\n"], reasoning = { effort = "low" } }

[routes.cheap-2]
url = "http://127.0.0.1:8002/v1"
model = "small"
api_key_file = "/run/credentials/klbr-core.service/cheap"
cache_profile = "openai_prompt_cache_retention"
cache_retention = "in_memory"
timeout_seconds = 1

[discord]
enabled = true
token_file = "/run/credentials/klbr-discord.service/token"
api_base = "http://127.0.0.1:9999/api/v9"
channels = ["123456789012345678", "2"]
ingest = "directed"
ambient_wake = false
include_bots = true
pending_aging_seconds = 86400

[limits]
memory_max = "512M"
tasks_max = 100000
cpu_quota = "50%"

[browser]
cookie_days = 7
`
	want := File{
		Agent: Agent{Route: "work", MaxSteps: 12, MaxTokens: DefaultMaxTokens, MaxTurnSeconds: DefaultMaxTurnSeconds,
			MaxEmptyCompletions: DefaultMaxEmpty, MaxConsecutiveErrors: DefaultMaxErrors, ContextBudgetTokens: 5000,
			RetryBackoffMillis: DefaultRetryBackoffMillis, MaxRetryBackoffMillis: DefaultMaxRetryBackoff,
			ReserveOutputTokens: DefaultReserveOutput, CompactAt: DefaultCompactAt, SummaryTimeoutSeconds: DefaultSummaryTimeout},
		Routes: map[string]Route{
			"main": {URL: "http://localhost:8001/v1", Model: "local", TimeoutSeconds: 120},
			"work": {
				URL: "https://api.example/v1", Model: "m", APIKeyEnv: "OPENAI_API_KEY",
				CacheProfile: CacheProfilePromptCacheOptions, CacheAffinity: "klbr:work", CacheRetention: "30m",
				TimeoutSeconds: 3600,
				ExtraOptions: map[string]any{
					"temperature": 0.7,
					"stop":        []any{"\n\n"},
					"reasoning":   map[string]any{"effort": "low"},
				},
			},
			"cheap-2": {
				URL: "http://127.0.0.1:8002/v1", Model: "small", APIKeyFile: "/run/credentials/klbr-core.service/cheap",
				CacheProfile: CacheProfilePromptCacheRetention, CacheRetention: "in_memory", TimeoutSeconds: 1,
			},
		},
		Discord: Discord{
			Enabled: true, TokenFile: "/run/credentials/klbr-discord.service/token",
			APIBase: "http://127.0.0.1:9999/api/v9", Channels: []string{"123456789012345678", "2"},
			Ingest: IngestDirected, AmbientWake: false, IncludeBots: true,
			PendingAgingSeconds: 86400, AuthorBurst: 20, AuthorPerMinute: 30, ChannelBurst: 60, ChannelPerMinute: 120,
			AttachmentMaxBytes: 25 << 20, AttachmentTimeoutSeconds: 60, AttachmentConcurrency: 2, AttachmentBytesPerHour: 1 << 30,
			AttachmentBytesPerSecond: DefaultAttachmentBytesPerSecond,
		},
		Limits:  Limits{MemoryMax: "512M", TasksMax: 100000, CPUQuota: "50%"},
		Browser: Browser{CookieDays: 7}, Storage: Storage{WarnAt: DefaultStorageWarnAt},
	}
	f, err := Parse("klbr.toml", []byte(full))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("got  %+v\nwant %+v", f, want)
	}
	if r, ok := f.AgentRoute(); !ok || r.Model != "m" {
		t.Errorf("AgentRoute() = %+v, %v", r, ok)
	}

	more := []struct{ name, doc string }{
		{"the design's example", `[agent]
route = "main"

[routes.main]
url = "http://localhost:8001/v1"    # any OpenAI-compatible /chat/completions endpoint
model = "local"
api_key_env = "OPENAI_API_KEY"      # optional; or api_key_file = "/run/credentials/…"
cache_profile = "openai_prompt_cache_key"   # optional, opt-in; checked at parse time
cache_affinity = "klbr:work"
extra_options = { temperature = 0.7 }       # cache fields are stripped from here
`},
		{"a route named by agent.route without routes", "[agent]\nroute = \"later\"\n"},
		{"affinity of 64 characters, not bytes", base + "cache_profile = \"openai_prompt_cache_key\"\ncache_affinity = \"" + strings.Repeat("é", 64) + "\"\n"},
		{"token_file left empty", "[discord]\ntoken_file = \"\"\n"},
		{"localhost api_base", "[discord]\napi_base = \"http://localhost:3000/api/v9\"\n"},
		{"memory in every unit", "[limits]\nmemory_max = \"1073741824\"\n"},
		{"memory in T", "[limits]\nmemory_max = \"1T\"\n"},
		{"quoted route keys", "[routes.\"main\"]\n\"url\" = 'http://x'\nmodel = 'm'\n"},
		{"CRLF", "[routes.main]\r\nurl = \"http://x\"\r\nmodel = \"m\"\r\n"},
	}
	for _, tt := range more {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse("klbr.toml", []byte(tt.doc)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestParseStripsCacheOptions(t *testing.T) {
	tests := []struct {
		name         string
		doc          string
		wantOptions  map[string]any
		wantStripped []string
	}{
		{
			name:         "inline",
			doc:          base + "extra_options = { temperature = 0.7, cache_prompt = true, prompt_cache_key = \"k\" }\n",
			wantOptions:  map[string]any{"temperature": 0.7},
			wantStripped: []string{"cache_prompt", "prompt_cache_key"},
		},
		{
			name: "all five, as a table",
			doc: base + "[routes.main.extra_options]\ncache_prompt = true\ncache_control = { type = \"ephemeral\" }\n" +
				"prompt_cache_key = \"k\"\nprompt_cache_retention = \"24h\"\nprompt_cache_options = { ttl = \"1h\" }\nseed = 7\n",
			wantOptions:  map[string]any{"seed": int64(7)},
			wantStripped: []string{"cache_control", "cache_prompt", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention"},
		},
		{
			name:         "in another case",
			doc:          base + "extra_options = { Prompt_Cache_Key = \"k\", CACHE_PROMPT = false }\n",
			wantOptions:  map[string]any{},
			wantStripped: []string{"CACHE_PROMPT", "Prompt_Cache_Key"},
		},
		{
			name:        "nothing to strip",
			doc:         base + "extra_options = { top_k = 40 }\n",
			wantOptions: map[string]any{"top_k": int64(40)},
		},
		{
			name: "no extra_options",
			doc:  base,
		},
		{
			name:         "stripped even with a profile",
			doc:          base + "cache_profile = \"openai_prompt_cache_key\"\ncache_affinity = \"a\"\nextra_options = { prompt_cache_key = \"other\" }\n",
			wantOptions:  map[string]any{},
			wantStripped: []string{"prompt_cache_key"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse("klbr.toml", []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			r := f.Routes["main"]
			if !reflect.DeepEqual(r.ExtraOptions, tt.wantOptions) {
				t.Errorf("ExtraOptions = %#v, want %#v", r.ExtraOptions, tt.wantOptions)
			}
			if !reflect.DeepEqual(r.StrippedOptions, tt.wantStripped) {
				t.Errorf("StrippedOptions = %#v, want %#v", r.StrippedOptions, tt.wantStripped)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := Defaults()
	good.Routes = map[string]Route{"main": {URL: "http://x", Model: "m", TimeoutSeconds: 120}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid File refused: %v", err)
	}

	tests := []struct {
		name   string
		change func(*File)
		key    string
		msg    string
	}{
		{"zero route timeout", func(f *File) { r := f.Routes["main"]; r.TimeoutSeconds = 0; f.Routes["main"] = r }, "routes.main.timeout_seconds", "out of range"},
		{"cache field in extra_options", func(f *File) {
			r := f.Routes["main"]
			r.ExtraOptions = map[string]any{"cache_prompt": true}
			f.Routes["main"] = r
		}, "routes.main.extra_options.cache_prompt", "declare cache_profile instead"},
		{"agent route missing", func(f *File) { f.Agent.Route = "other" }, "agent.route", "no [routes.other]"},
		{"zero Discord", func(f *File) {
			f.Discord = Discord{Ingest: IngestAll, PendingAgingSeconds: 1,
				AttachmentMaxBytes: 1, AttachmentTimeoutSeconds: 1, AttachmentConcurrency: 1, AttachmentBytesPerHour: 1,
				AuthorBurst: 1, AuthorPerMinute: 1, ChannelBurst: 1, ChannelPerMinute: 1}
		}, "discord.api_base", "required"},
		{"zero Limits", func(f *File) { f.Limits = Limits{TasksMax: 1, CPUQuota: "1%"} }, "limits.memory_max", "not a size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := good
			f.Routes = map[string]Route{"main": good.Routes["main"]}
			tt.change(&f)
			errs := Errors(f.Validate())
			if len(errs) != 1 {
				t.Fatalf("errors = %v, want one", errs)
			}
			e := errs[0]
			if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) || e.Line != 0 {
				t.Errorf("error = %#v, want key %s, no line, msg containing %q", e, tt.key, tt.msg)
			}
			if got, want := e.Error(), tt.key+": "+e.Msg; got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
}

func TestLimitsAccessors(t *testing.T) {
	tests := []struct {
		memory string
		bytes  uint64
		quota  string
		pct    int
	}{
		{"2G", 2 << 30, "200%", 200},
		{"512M", 512 << 20, "50%", 50},
		{"64K", 64 << 10, "1%", 1},
		{"1T", 1 << 40, "1000%", 1000},
		{"1000", 1000, "100%", 100},
	}
	for _, tt := range tests {
		t.Run(tt.memory, func(t *testing.T) {
			l := Limits{MemoryMax: tt.memory, CPUQuota: tt.quota}
			if b, err := l.MemoryMaxBytes(); err != nil || b != tt.bytes {
				t.Errorf("MemoryMaxBytes() = %d, %v, want %d", b, err, tt.bytes)
			}
			if p, err := l.CPUQuotaPercent(); err != nil || p != tt.pct {
				t.Errorf("CPUQuotaPercent() = %d, %v, want %d", p, err, tt.pct)
			}
		})
	}
}

func TestCheckBindAddr(t *testing.T) {
	tests := []struct {
		addr         string
		ok           bool
		notLoopback  bool // the error wraps ErrNotLoopback
		wantContains string
	}{
		{addr: "127.0.0.1:8765", ok: true},
		{addr: "[::1]:8765", ok: true},
		{addr: "localhost:1", ok: true},
		{addr: "127.1.2.3:80", ok: true},
		{addr: "127.0.0.1:0", ok: true},
		{addr: "LocalHost:8765", ok: true},
		{addr: "0.0.0.0:8765", notLoopback: true, wantContains: "klbr serves only loopback"},
		{addr: "192.168.1.1:80", notLoopback: true, wantContains: "klbr serves only loopback"},
		{addr: "example.com:80", notLoopback: true, wantContains: "klbr serves only loopback"},
		{addr: ":8765", notLoopback: true, wantContains: "klbr serves only loopback"},
		{addr: "[::]:8765", notLoopback: true, wantContains: "klbr serves only loopback"},
		{addr: "[::1%lo]:8765", notLoopback: true, wantContains: "refused"},
		{addr: "", wantContains: "refused"},
		{addr: "127.0.0.1", wantContains: "refused"},
		{addr: "::1", wantContains: "refused"},
		{addr: "127.0.0.1:", wantContains: "refused"},
		{addr: "localhost:http", wantContains: "refused"},
		{addr: "127.0.0.1:65536", wantContains: "refused"},
		{addr: "127.0.0.1:-1", wantContains: "refused"},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.addr), func(t *testing.T) {
			err := CheckBindAddr(tt.addr)
			if tt.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.wantContains) {
				t.Errorf("err = %v, want it to contain %q", err, tt.wantContains)
			}
			if errors.Is(err, ErrNotLoopback) != tt.notLoopback {
				t.Errorf("errors.Is(err, ErrNotLoopback) = %v, want %v (%v)", !tt.notLoopback, tt.notLoopback, err)
			}
		})
	}
}

// running reports whether process pid exists and is not a zombie: one
// killed with its parent waits for PID 1 to reap it.
func running(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may hold spaces.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// writeScript writes an executable shell script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestResolvePython(t *testing.T) {
	ctx := t.Context()

	t.Run("python3 on PATH", func(t *testing.T) {
		found, err := exec.LookPath("python3")
		if err != nil {
			citest.SkipOrFail(t, "no python3 on PATH")
		}
		bin, version, err := ResolvePython(ctx, "python3")
		if err != nil {
			t.Fatal(err)
		}
		if script, err := isScript(found); err != nil || script && bin == found {
			t.Errorf("bin = %s, the script found on PATH (%v)", bin, err)
		}
		if !filepath.IsAbs(bin) {
			t.Errorf("bin = %s, not absolute", bin)
		}
		if real, err := filepath.EvalSymlinks(bin); err != nil || real != bin {
			t.Errorf("bin = %s is a symlink to %s (%v)", bin, real, err)
		}
		head := make([]byte, 4)
		if f, err := os.Open(bin); err != nil {
			t.Fatal(err)
		} else {
			_, err = f.Read(head)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(head, []byte("\x7fELF")) {
			t.Errorf("bin = %s starts with %q, not an ELF header", bin, head)
		}
		if major, minor, ok := parseVersion(version); !ok || major != 3 || minor < 11 {
			t.Errorf("version = %q", version)
		}
		// What it resolved to runs and reports the same version.
		out, err := exec.Command(bin, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])").Output()
		if err != nil || strings.TrimSpace(string(out)) != version {
			t.Errorf("%s reports %q (%v), ResolvePython said %q", bin, out, err, version)
		}
	})

	t.Run("too old", func(t *testing.T) {
		script := writeScript(t, t.TempDir(), "python3.10", `case "$2" in
*executable*) echo "$0" ;;
*) echo 3.10.4 ;;
esac
`)
		bin, version, err := ResolvePython(ctx, script)
		if !errors.Is(err, ErrPythonTooOld) {
			t.Fatalf("err = %v, want ErrPythonTooOld", err)
		}
		if !strings.Contains(err.Error(), "3.10.4") || !strings.Contains(err.Error(), "KLBR_PYTHON") {
			t.Errorf("err = %v, want it to name the version and KLBR_PYTHON", err)
		}
		if bin != script || version != "3.10.4" {
			t.Errorf("bin, version = %q, %q; want %q, 3.10.4", bin, version, script)
		}
	})

	t.Run("python 2", func(t *testing.T) {
		script := writeScript(t, t.TempDir(), "python", "case \"$2\" in\n*executable*) echo \"$0\" ;;\n*) echo 2.7.18 ;;\nesac\n")
		if _, _, err := ResolvePython(ctx, script); !errors.Is(err, ErrPythonTooOld) {
			t.Fatalf("err = %v, want ErrPythonTooOld", err)
		}
	})

	t.Run("a name not on PATH", func(t *testing.T) {
		_, _, err := ResolvePython(ctx, "klbr-no-such-python")
		if !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("err = %v, want exec.ErrNotFound", err)
		}
		if err == nil || !strings.Contains(err.Error(), `"klbr-no-such-python"`) || !strings.Contains(err.Error(), "KLBR_PYTHON") {
			t.Errorf("err = %v, want it to name the interpreter and KLBR_PYTHON", err)
		}
	})

	t.Run("a path that does not exist", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "bin", "python3")
		if _, _, err := ResolvePython(ctx, missing); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("err = %v, want it to name %s", err, missing)
		}
	})

	t.Run("empty name", func(t *testing.T) {
		if _, _, err := ResolvePython(ctx, ""); err == nil {
			t.Error("accepted an empty name")
		}
	})

	t.Run("a script that fails", func(t *testing.T) {
		script := writeScript(t, t.TempDir(), "python3", "echo 'pyenv: version `3.99` is not installed' >&2\nexit 1\n")
		_, _, err := ResolvePython(ctx, script)
		if err == nil || !strings.Contains(err.Error(), "is not installed") {
			t.Errorf("err = %v, want it to carry the script's message", err)
		}
	})

	t.Run("a script that reports a relative interpreter", func(t *testing.T) {
		script := writeScript(t, t.TempDir(), "python3", "echo python3\n")
		if _, _, err := ResolvePython(ctx, script); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
			t.Errorf("err = %v", err)
		}
	})

	t.Run("a script that hangs", func(t *testing.T) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "child.pid")
		script := writeScript(t, dir, "python3", "sleep 30 &\necho $! > "+pidFile+"\nwait\n")
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, _, err := ResolvePython(short, script)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
		// The script's own child is gone too.
		data, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for running(pid) {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("the script's child %d outlived it", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("a virtual environment keeps its path", func(t *testing.T) {
		if _, err := exec.LookPath("python3"); err != nil {
			citest.SkipOrFail(t, "no python3 on PATH")
		}
		venv := filepath.Join(t.TempDir(), "venv")
		if out, err := exec.Command("python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
			citest.SkipOrFail(t, fmt.Sprintf("cannot make a venv: %v\n%s", err, out))
		}
		want := filepath.Join(venv, "bin", "python3")
		bin, _, err := ResolvePython(ctx, want)
		if err != nil {
			t.Fatal(err)
		}
		if bin != want {
			t.Errorf("bin = %s, want the venv's %s", bin, want)
		}
		out, err := exec.Command(bin, "-c", "import sys; print(sys.prefix)").Output()
		if err != nil || strings.TrimSpace(string(out)) != venv {
			t.Errorf("sys.prefix = %q (%v), want %s", out, err, venv)
		}
	})
}

// FuzzParse feeds Parse arbitrary bytes: it must not panic, every error must
// be placed in the document, and whatever it accepts must validate again.
// The seeds under testdata/fuzz/FuzzParse run as plain tests.
func FuzzParse(f *testing.F) {
	f.Add([]byte(base))
	f.Add([]byte("routes = { main = { url = \"http://x\", model = \"m\", extra_options = { cache_prompt = true } } }\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz.toml", data)
		if err != nil {
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error without an *Error: %v", err)
			}
			for _, e := range errs {
				if e.File != "fuzz.toml" || e.Line < 1 || e.Column < 1 || e.Msg == "" {
					t.Fatalf("error without a place or message: %#v", e)
				}
			}
			return
		}
		if err := file.Validate(); err != nil {
			t.Fatalf("Parse accepted what Validate refuses: %v", err)
		}
		if _, ok := file.Routes[file.Agent.Route]; len(file.Routes) > 0 && !ok {
			t.Fatalf("agent.route %q names no route", file.Agent.Route)
		}
		for id, r := range file.Routes {
			for k := range r.ExtraOptions {
				if isCacheOptionKey(k) {
					t.Fatalf("routes.%s.extra_options keeps the cache field %q", id, k)
				}
			}
		}
	})
}

func TestParseRouteDialects(t *testing.T) {
	doc := `[agent]
route = "main"
fallback = ["local", "cloud"]

[routes.main]
url = "https://api.deepseek.com/v1/"
model = "deepseek-v4-pro"
dialect = "deepseek"

[routes.local]
url = "http://127.0.0.1:11434/v1"
model = "qwen3:8b"
dialect = "ollama"
reasoning_replay = true

[routes.cloud]
url = "https://api.mistral.ai/v1"
model = "mistral-large-latest"
dialect = "mistral"
stream_usage = false
`
	f, err := Parse("klbr.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.StepRoutes(); fmt.Sprint(got) != "[main local cloud]" {
		t.Errorf("step routes %v", got)
	}
	if r := f.Routes["main"]; r.Dialect != DialectDeepSeek || r.StreamUsage != nil || r.ReasoningReplay != nil {
		t.Errorf("main %+v", r)
	}
	if r := f.Routes["local"]; r.ReasoningReplay == nil || !*r.ReasoningReplay {
		t.Errorf("local %+v", r)
	}
	if r := f.Routes["cloud"]; r.StreamUsage == nil || *r.StreamUsage {
		t.Errorf("cloud %+v", r)
	}
	for _, d := range Dialects() {
		if _, err := Parse("klbr.toml", []byte(fmt.Sprintf("[routes.main]\nurl = \"http://x/v1\"\nmodel = \"m\"\ndialect = %q\n", d))); err != nil {
			t.Errorf("dialect %s: %v", d, err)
		}
	}
	if err := (&File{Agent: Defaults().Agent, Routes: map[string]Route{"main": {URL: "http://x/v1", Model: "m", TimeoutSeconds: 1}},
		Discord: Defaults().Discord, Limits: Defaults().Limits}).Validate(); err != nil {
		t.Errorf("a route built in code without a dialect: %v", err)
	}
}

// A set KLBR_SKILLS_DIR (seed 000) is honored: an absolute path the skills
// are also read from; unset, nothing is read from the workspace.
func TestSkillsDirHonored(t *testing.T) {
	cfg, err := Load(envMap(map[string]string{"HOME": "/home/u", "KLBR_DATA_DIR": "/d", "KLBR_WORKSPACE": "/w", "KLBR_SKILLS_DIR": "sk"}))
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if cfg.Paths.SkillsDir != filepath.Join(wd, "sk") {
		t.Fatalf("SkillsDir = %q, want %q", cfg.Paths.SkillsDir, filepath.Join(wd, "sk"))
	}
	cfg, err = Load(envMap(map[string]string{"HOME": "/home/u", "KLBR_DATA_DIR": "/d", "KLBR_WORKSPACE": "/w"}))
	if err != nil || cfg.Paths.SkillsDir != "" {
		t.Fatalf("unset: SkillsDir = %q, %v; want none (<workspace>/skills is not read implicitly)", cfg.Paths.SkillsDir, err)
	}
}
