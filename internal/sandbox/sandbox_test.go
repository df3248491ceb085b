package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

// TestWorkerSandboxHidesSecrets: the data directory, the config file and every secret file
// it names are denied; the runtime, releases and skills are the read-only exceptions; the
// workspace and drafts are writable.
func TestWorkerSandboxHidesSecrets(t *testing.T) {
	data, etc := t.TempDir(), t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(etc, name)
		if err := os.WriteFile(p, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	conf, key, token := file("klbr.toml", 0o600), file("openai", 0o400), file("discord-token", 0o600)
	public := file("public.toml", 0o644) // readable by everyone anyway (a config in /nix/store)
	cfg := &config.Config{
		Paths: config.Paths{DataDir: data, Workspace: "/srv/ws", ConfigFile: conf},
		File: config.File{
			Routes:  map[string]config.Route{"main": {APIKeyFile: key}, "other": {APIKeyFile: public}},
			Discord: config.Discord{TokenFile: token},
		},
	}
	sb, _ := ForWorkers(cfg, "/usr/bin/python3", filepath.Join(data, "runtime", "abc", "src"))
	for _, p := range []string{data, conf, key, token} {
		if !slices.Contains(sb.Deny, p) {
			t.Errorf("Deny %v lacks %s", sb.Deny, p)
		}
	}
	if slices.Contains(sb.Deny, public) {
		t.Errorf("Deny holds a file everyone can read: %s", public)
	}
	for _, p := range []string{filepath.Join(data, "runtime"), filepath.Join(data, "releases"), filepath.Join(data, "skills")} {
		if !slices.Contains(sb.ReadOnly, p) {
			t.Errorf("ReadOnly %v lacks %s", sb.ReadOnly, p)
		}
	}
	if !slices.Contains(sb.ReadWrite, "/srv/ws") || !slices.Contains(sb.ReadWrite, filepath.Join(data, "drafts")) {
		t.Errorf("ReadWrite %v", sb.ReadWrite)
	}
	if sb.TempDir == "" || within(sb.TempDir, data) {
		t.Errorf("TempDir %q", sb.TempDir)
	}
	if os.Geteuid() == 0 && !sb.DropUser && !sb.DropCaps {
		t.Error("as root the workers keep root's powers")
	}
}

func TestReachable(t *testing.T) {
	dir := t.TempDir()
	inner := filepath.Join(dir, "a", "b")
	os.MkdirAll(inner, 0o755)
	os.Chmod(filepath.Join(dir, "a"), 0o700)
	if err := reachable(65534, 65534, inner, 5); err == nil && os.Geteuid() == 0 {
		t.Error("a path under a 0700 directory of root is reachable to uid 65534")
	}
	os.Chmod(filepath.Join(dir, "a"), 0o711)
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // the test's own temporary directories
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("%s is not searchable by others here", d)
		}
	}
	if err := reachable(65534, 65534, inner, 5); err != nil {
		t.Errorf("reachable through 0711: %v", err)
	}
}
