// Package profiles reads child agent profiles: profiles/<name>.toml in a
// behavior release. A profile gives a child spawned with it instructions,
// a model route, a budget, the speech ops it may use and a default
// workspace. Parse is bounded and strict (unknown keys are refused by
// name); a release whose profile does not parse is refused at publish
// (behavior.Scan calls CheckFiles).
package profiles

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/klbr-dev/klbr/internal/budget"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"
)

// Dir is the directory of profiles in a behavior tree.
const Dir = "profiles"

// Bounds of a profile.
const (
	MaxFileBytes        = 64 << 10
	MaxDescriptionBytes = 1 << 10
	MaxInstructionBytes = 32 << 10
	MaxFallback         = 7 // with the route, at most 8 routes: the router's bound on a plan
	MaxProfiles         = 100
)

// Delegable lists the speech ops a spawn or a profile may delegate to a
// child (agents.Delegable).
var Delegable = []string{"local.send", "discord.send", "discord.react", "discord.mark"}

// Workspaces a profile may name as its default (agents.spawn's workspace).
var Workspaces = []string{"shared", "worktree", "read_only"}

var (
	// NamePattern is the pattern of a profile's name (its file name without .toml).
	NamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	routeName   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)
)

// ErrInvalid marks a profile that does not parse; ErrNotFound one that
// the release does not have.
var (
	ErrInvalid  = errors.New("invalid profile")
	ErrNotFound = errors.New("no such profile")
)

// Profile is one profiles/<name>.toml.
type Profile struct {
	Name         string        `toml:"-" json:"name"`
	Description  string        `toml:"description" json:"description"`
	Instructions string        `toml:"instructions" json:"instructions,omitempty"`
	Route        string        `toml:"route" json:"route,omitempty"`
	Fallback     []string      `toml:"fallback" json:"fallback,omitempty"`
	Budget       budget.Budget `toml:"budget" json:"budget"`
	Delegate     []string      `toml:"delegate" json:"delegate,omitempty"`
	Workspace    string        `toml:"workspace" json:"workspace,omitempty"`
	// Host, when set, is the worker host its children work on (agents.spawn's host=).
	Host string `toml:"host" json:"host,omitempty"`
}

// MaxHostBytes bounds a profile's host.
const MaxHostBytes = 200

// Routes is the profile's plan: its route, then its fallback; nil when it
// names no route (the child goes along the agent's plan).
func (p Profile) Routes() []string {
	if p.Route == "" {
		return nil
	}
	return append([]string{p.Route}, p.Fallback...)
}

// Parse decodes and checks profile name's file b.
func Parse(name string, b []byte) (Profile, error) {
	var p Profile
	if !NamePattern.MatchString(name) {
		return p, fmt.Errorf("%w: %q is not a profile name (%s)", ErrInvalid, name, NamePattern)
	}
	if len(b) > MaxFileBytes {
		return p, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(b), MaxFileBytes)
	}
	if !utf8.Valid(b) {
		return p, fmt.Errorf("%w: not UTF-8", ErrInvalid)
	}
	if err := toml.NewDecoder(bytes.NewReader(b)).DisallowUnknownFields().Decode(&p); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			var keys []string
			for i := range strict.Errors {
				keys = append(keys, strings.Join(strict.Errors[i].Key(), "."))
			}
			return Profile{}, fmt.Errorf("%w: unknown key %s (known: description, instructions, route, fallback, [budget] tokens/wall_seconds/model_requests/usd, delegate, workspace, host)",
				ErrInvalid, strings.Join(keys, ", "))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, col := de.Position()
			return Profile{}, fmt.Errorf("%w: line %d column %d: %s", ErrInvalid, line, col, strings.TrimPrefix(de.Error(), "toml: "))
		}
		return Profile{}, fmt.Errorf("%w: %s", ErrInvalid, strings.TrimPrefix(err.Error(), "toml: "))
	}
	p.Name = name
	return p, p.check()
}

func (p Profile) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
	}
	switch {
	case strings.TrimSpace(p.Description) == "":
		return bad("description is empty; say in a line what a child with this profile is for")
	case len(p.Description) > MaxDescriptionBytes:
		return bad("description is %d bytes, at most %d", len(p.Description), MaxDescriptionBytes)
	case len(p.Instructions) > MaxInstructionBytes:
		return bad("instructions are %d bytes, at most %d", len(p.Instructions), MaxInstructionBytes)
	case p.Route == "" && len(p.Fallback) > 0:
		return bad("fallback without route")
	case len(p.Fallback) > MaxFallback:
		return bad("fallback names %d routes, at most %d", len(p.Fallback), MaxFallback)
	case p.Workspace != "" && !slices.Contains(Workspaces, p.Workspace):
		return bad("workspace %q is none of %s", p.Workspace, strings.Join(Workspaces, ", "))
	case len(p.Host) > MaxHostBytes || strings.ContainsAny(p.Host, " \t\n/"):
		return bad("host %q is not a [hosts.NAME] or \"label:L\"", truncate(p.Host, 64))
	case p.Host != "" && p.Workspace != "" && p.Workspace != "worktree":
		return bad("workspace %q with host: a child on a host works on a copy of its own (workspace \"worktree\", or none)", p.Workspace)
	case len(p.Delegate) > len(Delegable):
		return bad("delegate names %d ops, at most %d", len(p.Delegate), len(Delegable))
	}
	seen := map[string]bool{}
	for _, r := range p.Routes() {
		if !routeName.MatchString(r) {
			return bad("%q is not a route name", r)
		}
		if seen[r] {
			return bad("route %q is named twice", r)
		}
		seen[r] = true
	}
	for _, d := range p.Delegate {
		if !slices.Contains(Delegable, d) {
			return bad("delegate: %q cannot be delegated; delegable: %s", d, strings.Join(Delegable, ", "))
		}
	}
	if err := p.Budget.Check("[budget] "); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// nameOf returns the profile name of tree path p (profiles/<name>.toml),
// and whether p is in the profiles directory at all.
func nameOf(p string) (string, bool) {
	dir, file := path.Split(p)
	if dir != Dir+"/" {
		return "", strings.HasPrefix(p, Dir+"/")
	}
	return strings.TrimSuffix(file, ".toml"), true
}

// CheckFiles checks every profile of a tree's files (path to content, as
// behavior.Scan reads them): each profiles/<name>.toml parses, and the
// directory holds nothing else. The error names the file.
func CheckFiles(files map[string][]byte) ([]string, error) {
	var names []string
	for _, p := range slices.Sorted(maps.Keys(files)) {
		name, in := nameOf(p)
		if !in {
			continue
		}
		if name == "" || !strings.HasSuffix(p, ".toml") || strings.Count(p, "/") != 1 {
			return nil, fmt.Errorf("%w: %s: profiles/ holds only <name>.toml files", ErrInvalid, p)
		}
		if _, err := Parse(name, files[p]); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		names = append(names, name)
	}
	if len(names) > MaxProfiles {
		return nil, fmt.Errorf("%w: %d profiles, at most %d", ErrInvalid, len(names), MaxProfiles)
	}
	return names, nil
}

// Load reads profile name of the release whose tree is tree. A missing
// one is ErrNotFound, naming the profiles the release has.
func Load(tree, name string) (Profile, error) {
	if !NamePattern.MatchString(name) {
		return Profile{}, fmt.Errorf("%w: %q is not a profile name (%s)", ErrInvalid, name, NamePattern)
	}
	b, err := os.ReadFile(filepath.Join(tree, Dir, name+".toml"))
	if errors.Is(err, os.ErrNotExist) {
		names, _ := Names(tree)
		have := "it has none"
		if len(names) > 0 {
			have = "it has " + strings.Join(names, ", ")
		}
		return Profile{}, fmt.Errorf("%w %q in the release (%s)", ErrNotFound, name, have)
	}
	if err != nil {
		return Profile{}, err
	}
	p, err := Parse(name, b)
	if err != nil {
		return p, fmt.Errorf("profiles/%s.toml: %w", name, err)
	}
	return p, nil
}

// Names lists the profiles of the release whose tree is tree, sorted.
func Names(tree string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(tree, Dir))
	if errors.Is(err, os.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".toml"); ok && e.Type().IsRegular() && NamePattern.MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

// List reads every profile of the release whose tree is tree.
func List(tree string) ([]Profile, error) {
	names, err := Names(tree)
	if err != nil {
		return nil, err
	}
	out := make([]Profile, 0, len(names))
	for _, n := range names {
		p, err := Load(tree, n)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// ListFS reads and checks every profile of a behavior tree given as a
// file system (a source tree, the embedded default), as publishing would.
func ListFS(fsys fs.FS) ([]Profile, error) {
	ents, err := fs.ReadDir(fsys, Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Profile{}, nil
	}
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, e := range ents {
		p := Dir + "/" + e.Name()
		if e.IsDir() {
			files[p+"/"] = nil // refused by CheckFiles
			continue
		}
		if files[p], err = fs.ReadFile(fsys, p); err != nil {
			return nil, err
		}
	}
	if _, err := CheckFiles(files); err != nil {
		return nil, err
	}
	out := []Profile{}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		name, _ := nameOf(p)
		prof, _ := Parse(name, files[p])
		out = append(out, prof)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
