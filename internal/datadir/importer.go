package datadir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// ImportedRoute is one route made from the previous runtime's llm block.
type ImportedRoute struct {
	Name       string `json:"name"`
	URL        string `json:"url"`
	Model      string `json:"model"`
	KeyWritten string `json:"api_key_file_written,omitempty"` // a key the KDL held, moved to this file
}

// KDLResult is what ImportKDL wrote.
type KDLResult struct {
	ConfigFile string          `json:"config_file"`
	Routes     []ImportedRoute `json:"routes"`
}

// routeFields are the llm block's fields, as klbr.toml's route keys.
var routeFields = map[string]string{
	"url": "url", "model": "model", "cache_profile": "cache_profile", "cache_affinity": "cache_affinity",
	"cache_retention": "cache_retention", "api_key_env": "api_key_env", "api_key_file": "api_key_file",
	"dialect": "dialect", "timeout_seconds": "timeout_seconds",
}

var routeName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ImportKDL turns the previous runtime's KDL model configuration (llm
// blocks: url, model, cache_profile, cache_affinity, cache_retention, and
// api_key_env, api_key_file, dialect, timeout_seconds, extra_options) into
// [routes.NAME] sections appended to configFile. An unnamed first block is
// route main. A key written in the KDL file itself goes to a 0600 file in
// the data directory, which the route names (klbr.toml never holds a key).
// It refuses a live data directory, a route name klbr.toml already has, and
// a result klbr-core's own parser rejects (the file is left as it was).
func ImportKDL(ctx context.Context, src []byte, configFile, dataDir string) (KDLResult, error) {
	res := KDLResult{ConfigFile: configFile}
	if err := refuseLive(ctx, dataDir); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	nodes, err := parseKDL(src)
	if err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	old, err := os.ReadFile(configFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("import: %w", err)
	}
	existing := map[string]bool{}
	if len(old) > 0 {
		f, err := config.Parse(configFile, old)
		if err != nil {
			return res, fmt.Errorf("import: the current %s does not parse; fix it first: %w", configFile, err)
		}
		for n := range f.Routes {
			existing[n] = true
		}
	}
	var b strings.Builder
	var keys []func() error
	unnamed := 0
	for _, n := range nodes {
		if n.Name != "llm" {
			continue
		}
		r := ImportedRoute{}
		switch {
		case len(n.Args) > 0:
			s, ok := n.Args[0].(string)
			if !ok || !routeName.MatchString(s) {
				return res, fmt.Errorf("import: KDL line %d: llm's name must be letters, digits, _ or -", n.Line)
			}
			r.Name = s
		case unnamed == 0:
			r.Name, unnamed = "main", 1
		default:
			unnamed++
			r.Name = fmt.Sprintf("main%d", unnamed)
		}
		if existing[r.Name] {
			return res, fmt.Errorf("import: %s already has [routes.%s]; rename one of them", configFile, r.Name)
		}
		existing[r.Name] = true
		fmt.Fprintf(&b, "\n# imported from the previous runtime's KDL model configuration, %s\n[routes.%s]\n", time.Now().UTC().Format(time.DateOnly), r.Name)
		for _, c := range n.Children {
			if len(c.Args) != 1 && c.Name != "extra_options" {
				return res, fmt.Errorf("import: KDL line %d: %s takes one value", c.Line, c.Name)
			}
			switch key, ok := routeFields[c.Name]; {
			case ok:
				v, err := tomlValue(c.Args[0])
				if err != nil {
					return res, fmt.Errorf("import: KDL line %d: %s: %w", c.Line, c.Name, err)
				}
				fmt.Fprintf(&b, "%s = %s\n", key, v)
				switch c.Name {
				case "url":
					r.URL, _ = c.Args[0].(string)
				case "model":
					r.Model, _ = c.Args[0].(string)
				}
			case c.Name == "api_key":
				key, ok := c.Args[0].(string)
				if !ok || key == "" {
					return res, fmt.Errorf("import: KDL line %d: api_key is a string", c.Line)
				}
				file := filepath.Join(dataDir, "route-"+r.Name+".key")
				r.KeyWritten = file
				keys = append(keys, func() error { return writeFileSynced(file, []byte(key+"\n"), 0o600) })
				v, _ := tomlValue(file)
				fmt.Fprintf(&b, "api_key_file = %s\n", v)
			case c.Name == "extra_options":
				var parts []string
				for _, o := range c.Children {
					if len(o.Args) != 1 {
						return res, fmt.Errorf("import: KDL line %d: extra option %s takes one value", o.Line, o.Name)
					}
					v, err := tomlValue(o.Args[0])
					if err != nil {
						return res, fmt.Errorf("import: KDL line %d: %s: %w", o.Line, o.Name, err)
					}
					k, _ := json.Marshal(o.Name)
					parts = append(parts, string(k)+" = "+v)
				}
				sort.Strings(parts)
				fmt.Fprintf(&b, "extra_options = { %s }\n", strings.Join(parts, ", "))
			default:
				return res, fmt.Errorf("import: KDL line %d: %s is not a route field klbr knows (url, model, cache_profile, cache_affinity, cache_retention, api_key, api_key_env, api_key_file, dialect, timeout_seconds, extra_options)", c.Line, c.Name)
			}
		}
		res.Routes = append(res.Routes, r)
	}
	if len(res.Routes) == 0 {
		return res, errors.New("import: the KDL file has no llm block")
	}
	next := append(append([]byte{}, old...), b.String()...)
	if _, err := config.Parse(configFile, next); err != nil {
		return res, fmt.Errorf("import: the imported routes do not pass klbr's checks (nothing was written): %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(configFile), 0o700); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	for _, k := range keys {
		if err := k(); err != nil {
			return res, fmt.Errorf("import: %w", err)
		}
	}
	tmp := configFile + ".import-tmp"
	if err := writeFileSynced(tmp, next, 0o600); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	if err := os.Rename(tmp, configFile); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	return res, nil
}

// tomlValue renders a KDL value as a TOML value.
func tomlValue(v any) (string, error) {
	switch x := v.(type) {
	case string:
		b, _ := json.Marshal(x) // a JSON string is a TOML basic string
		return string(b), nil
	case int64, float64, bool:
		return fmt.Sprint(x), nil
	}
	return "", fmt.Errorf("%v is not a string, number or boolean", v)
}

// SoulResult is the behavior draft ImportSoul made.
type SoulResult struct {
	Draft         string `json:"draft"`
	Path          string `json:"path"`
	ParentRelease string `json:"parent_release"`
}

// ImportSoul makes the previous runtime's soul file a behavior draft for
// review: a copy of the default session's active release (or the default
// tree, in a directory with none) with soul.md replaced, in
// <data>/drafts/<id>, as behavior.draft makes them. Nothing is activated:
// the operator reviews the draft and publishes it. It refuses a live data
// directory.
func ImportSoul(ctx context.Context, soulPath, dataDir string) (SoulResult, error) {
	var res SoulResult
	if err := refuseLive(ctx, dataDir); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	f, err := os.Open(soulPath)
	if err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	soul, err := io.ReadAll(io.LimitReader(f, behavior.MaxFileBytes+1))
	f.Close()
	if err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	if len(soul) > behavior.MaxFileBytes {
		return res, fmt.Errorf("import: %s is larger than a behavior file may be (%d bytes)", soulPath, behavior.MaxFileBytes)
	}
	var tree fs.FS = behaviortree.Tree()
	var epoch int64
	if setup.Initialized(dataDir) {
		r, err := store.OpenReader(ctx, dataDir)
		if err != nil {
			return res, fmt.Errorf("import: %w", err)
		}
		sess, err := r.Session(ctx, "default")
		r.Close()
		if err == nil && sess.PolicyRevision != "" {
			tree = os.DirFS(filepath.Join(dataDir, "releases", sess.PolicyRevision, "tree"))
			res.ParentRelease, epoch = sess.PolicyRevision, sess.BehaviorEpoch
		}
	}
	if res.ParentRelease == "" {
		m, _, err := behavior.Scan(tree)
		if err != nil {
			return res, fmt.Errorf("import: %w", err)
		}
		res.ParentRelease = m.ID
	}
	b := make([]byte, 6)
	rand.Read(b)
	res.Draft = time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b)
	dir := filepath.Join(dataDir, "drafts", res.Draft)
	res.Path = filepath.Join(dir, "tree")
	if err := fs.WalkDir(tree, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(res.Path, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if path.Clean(p) == "soul.md" {
			return nil
		}
		data, err := fs.ReadFile(tree, p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	}); err != nil {
		os.RemoveAll(dir)
		return res, fmt.Errorf("import: copy the parent release: %w", err)
	}
	if err := os.WriteFile(filepath.Join(res.Path, "soul.md"), soul, 0o644); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	rec := map[string]any{"draft": res.Draft, "path": res.Path, "session": "default", "parent_epoch": epoch,
		"parent_release": res.ParentRelease, "created_at": time.Now(), "imported_from": soulPath}
	j, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "draft.json"), j, 0o600); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	return res, nil
}
