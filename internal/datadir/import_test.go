package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

const previousKDL = `// the previous runtime's model configuration
llm {
    url "https://api.example/v1"
    model "m"
    cache_profile "openai_prompt_cache_key"   // a route property
    cache_affinity "klbr:work"
    api_key_env "EXAMPLE_KEY"
    timeout_seconds 90
    dialect "openai"
    extra_options {
        temperature 0.2
    }
}
llm "fast" {
    url "http://localhost:8002/v1"; model "small"
    cache_profile "openai_prompt_cache_retention"
    cache_affinity "klbr:fast"
    cache_retention "24h"
    api_key "sk-not-a-real-key"
}
/-llm "disabled" { url "http://x/v1"; model "y" }
`

// TestImportKDLEveryRouteField: every field of the previous runtime's llm
// blocks lands in klbr.toml as klbr-core's own parser reads it; a key in
// the KDL moves to a private file; a live target is refused.
func TestImportKDLEveryRouteField(t *testing.T) {
	dir := newDataDir(t)
	cfgFile := filepath.Join(dir, "klbr.toml")
	res, err := ImportKDL(context.Background(), []byte(previousKDL), cfgFile, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Routes) != 2 {
		t.Fatalf("routes %+v", res.Routes)
	}
	data, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.Parse(cfgFile, data)
	if err != nil {
		t.Fatalf("klbr.toml after the import: %v\n%s", err, data)
	}
	main, fast := f.Routes["main"], f.Routes["fast"]
	if main.URL != "https://api.example/v1" || main.Model != "m" || main.CacheProfile != "openai_prompt_cache_key" ||
		main.CacheAffinity != "klbr:work" || main.APIKeyEnv != "EXAMPLE_KEY" || main.TimeoutSeconds != 90 || main.Dialect != "openai" ||
		main.ExtraOptions["temperature"] != 0.2 {
		t.Errorf("main = %+v", main)
	}
	if fast.URL != "http://localhost:8002/v1" || fast.Model != "small" || fast.CacheProfile != "openai_prompt_cache_retention" ||
		fast.CacheAffinity != "klbr:fast" || fast.CacheRetention != "24h" || fast.APIKeyFile == "" {
		t.Errorf("fast = %+v", fast)
	}
	if _, ok := f.Routes["disabled"]; ok {
		t.Error("a /- commented block was imported")
	}
	if strings.Contains(string(data), "sk-not-a-real-key") {
		t.Error("the key landed in klbr.toml")
	}
	if b, err := os.ReadFile(fast.APIKeyFile); err != nil || strings.TrimSpace(string(b)) != "sk-not-a-real-key" {
		t.Errorf("the key file: %q %v", b, err)
	} else if fi, _ := os.Stat(fast.APIKeyFile); fi.Mode().Perm() != 0o600 {
		t.Errorf("the key file is %v", fi.Mode().Perm())
	}
	// Importing again would define the routes twice: refused, the file unchanged.
	if _, err := ImportKDL(context.Background(), []byte(previousKDL), cfgFile, dir); err == nil || !strings.Contains(err.Error(), "already has [routes.main]") {
		t.Errorf("a second import: %v", err)
	}
	if after, _ := os.ReadFile(cfgFile); string(after) != string(data) {
		t.Error("a refused import changed klbr.toml")
	}
	// A value klbr's checks refuse (a retention the profile does not accept) writes nothing.
	other := filepath.Join(t.TempDir(), "klbr.toml")
	bad := "llm {\n url \"http://x/v1\"\n model \"m\"\n cache_profile \"openai_prompt_cache_key\"\n cache_affinity \"a\"\n cache_retention \"24h\"\n}\n"
	if _, err := ImportKDL(context.Background(), []byte(bad), other, dir); err == nil {
		t.Error("a route klbr refuses was imported")
	}
	if _, err := os.Stat(other); err == nil {
		t.Error("a refused import wrote klbr.toml")
	}

	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := ImportKDL(context.Background(), []byte(previousKDL), filepath.Join(t.TempDir(), "k.toml"), dir); !errors.Is(err, ErrInUse) {
		t.Errorf("import into a live data directory: %v, want ErrInUse", err)
	}
	soul := filepath.Join(t.TempDir(), "soul.md")
	writeFile(t, soul, "I am the previous soul.\n")
	if _, err := ImportSoul(context.Background(), soul, dir); !errors.Is(err, ErrInUse) {
		t.Errorf("soul import into a live data directory: %v, want ErrInUse", err)
	}
}

// TestImportSoulMakesADraft: the soul file becomes the soul.md of a draft
// of the default tree, for review; nothing is activated.
func TestImportSoulMakesADraft(t *testing.T) {
	dir := newDataDir(t)
	soul := filepath.Join(t.TempDir(), "SOUL.md")
	writeFile(t, soul, "I am the previous soul.\n")
	res, err := ImportSoul(context.Background(), soul, dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(res.Path, "soul.md")); err != nil || string(b) != "I am the previous soul.\n" {
		t.Errorf("draft soul.md: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(res.Path, "instructions.md")); err != nil {
		t.Errorf("the draft lacks the rest of the tree: %v", err)
	}
	if res.ParentRelease == "" {
		t.Error("the draft names no parent release")
	}
	pins, err := draftPins(filepath.Join(dir, "drafts"))
	if err != nil || pins[res.Draft] != res.ParentRelease {
		t.Errorf("the draft record: %v %v", pins, err)
	}
}

func FuzzParseKDL(f *testing.F) {
	f.Add([]byte(previousKDL))
	f.Add([]byte(`a "b" c=1 { d; e "\"" }`))
	f.Add([]byte("/* x */ n 1.5 -2 #true null\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes, err := parseKDL(data)
		if err != nil {
			return
		}
		var walk func([]*kdlNode, int)
		walk = func(ns []*kdlNode, depth int) {
			if depth > maxKDLDepth+1 {
				t.Fatalf("nesting %d passed the bound", depth)
			}
			for _, n := range ns {
				if n == nil || n.Name == "" {
					t.Fatalf("a node without a name: %+v", n)
				}
				walk(n.Children, depth+1)
			}
		}
		walk(nodes, 0)
	})
}

func FuzzDecodeManifest(f *testing.F) {
	sha := strings.Repeat("a", 64)
	f.Add([]byte(`{"format":1,"files":[{"path":"runtime.sqlite","sha256":"` + sha + `","size":4096,"mode":384}]}`))
	f.Add([]byte(`{"format":1,"files":[{"path":"runtime.sqlite","sha256":"` + sha + `","size":1},{"path":"drafts/x","link":"/etc"},{"path":"drafts/x/passwd","sha256":"` + sha + `","size":1}]}`))
	f.Add([]byte(`{"format":1,"files":[{"path":"../escape","sha256":"` + sha + `","size":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeManifest(data)
		if err != nil {
			return
		}
		for _, fl := range m.Files {
			if fl.Link != "" {
				t.Fatalf("accepted the link %q → %q: a restore would make it", fl.Path, fl.Link)
			}
			if checkRelPath(fl.Path) != nil || strings.HasPrefix(fl.Path, "/") || strings.Contains("/"+fl.Path+"/", "/../") {
				t.Fatalf("accepted a path that leaves the backup: %q", fl.Path)
			}
		}
	})
}
