// Package behavior publishes behavior trees as immutable, content-addressed
// releases (<data>/releases/<sha256>/), verifies them on load, and tells
// what kind of activation a change between two releases needs.
package behavior

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/klbr-dev/klbr/internal/profiles"
)

// Bounds of a behavior tree.
const (
	MaxFileBytes  = 256 << 10
	MaxTreeBytes  = 8 << 20
	MaxTreeFiles  = 2000
	FormatVersion = 1
	SDKVersion    = "0.1.0"
	Protocol      = 1
)

// ErrInvalidTree marks a tree that cannot be published.
var ErrInvalidTree = errors.New("invalid behavior tree")

// ErrCorrupt marks a release whose bytes no longer match its manifest.
var ErrCorrupt = errors.New("release does not match its manifest")

// File is one file of a release.
type File struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Components are fingerprints of the parts of a release that decide how it
// is activated.
type Components struct {
	Documents   string `json:"documents"`   // soul, instructions and other top-level documents; profiles/
	Hooks       string `json:"hooks"`       // klbr_hooks/, settings.toml, tests/
	Skills      string `json:"skills"`      // skills/ and klbr_skills/
	Environment string `json:"environment"` // anything else
}

// Manifest describes a release. ID is the SHA-256 of the canonical JSON of
// Files, and names the release's directory.
type Manifest struct {
	Format     int        `json:"format"`
	ID         string     `json:"id"`
	SDK        string     `json:"sdk"`
	Protocol   int        `json:"protocol"`
	Files      []File     `json:"files"`
	Components Components `json:"components"`
	Skills     []string   `json:"skills"`
}

var (
	skillID  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	pathPart = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
)

// skipped says which entries of a source tree are not behavior: Go files
// (the embedding), VCS and editor litter. Bytecode is refused, not skipped.
func skipped(name string, dir bool) bool {
	return strings.HasSuffix(name, ".go") || name == ".git" || name == ".gitignore" || strings.HasSuffix(name, "~")
}

// Scan reads and checks a tree: regular files only, no symlinks, no
// bytecode, bounded sizes, well-formed names and skills.
func Scan(fsys fs.FS) (Manifest, map[string][]byte, error) {
	m := Manifest{Format: FormatVersion, SDK: SDKVersion, Protocol: Protocol}
	contents := map[string][]byte{}
	var total int64
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		name := d.Name()
		if skipped(name, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: %s is a symlink; releases hold regular files only", ErrInvalidTree, p)
		case name == "__pycache__" || strings.HasSuffix(name, ".pyc") || strings.HasSuffix(name, ".pyo"):
			return fmt.Errorf("%w: %s is bytecode; publish clean source", ErrInvalidTree, p)
		case !pathPart.MatchString(name) || strings.Contains(name, ".."):
			return fmt.Errorf("%w: %q is not an allowed file name", ErrInvalidTree, p)
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%w: %s is not a regular file", ErrInvalidTree, p)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		if len(b) > MaxFileBytes {
			return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalidTree, p, len(b), MaxFileBytes)
		}
		total += int64(len(b))
		if total > MaxTreeBytes || len(contents) >= MaxTreeFiles {
			return fmt.Errorf("%w: the tree is over %d bytes or %d files", ErrInvalidTree, MaxTreeBytes, MaxTreeFiles)
		}
		sum := sha256.Sum256(b)
		m.Files = append(m.Files, File{Path: p, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))})
		contents[p] = b
		return nil
	})
	if err != nil {
		return m, nil, err
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
	if m.Skills, err = checkSkills(contents); err != nil {
		return m, nil, err
	}
	if _, err := profiles.CheckFiles(contents); err != nil {
		return m, nil, fmt.Errorf("%w: %v", ErrInvalidTree, err)
	}
	m.ID = hashFiles(m.Files)
	m.Components = components(m.Files)
	return m, contents, nil
}

// checkSkills applies seed 000's rule to skills/<id>/SKILL.md: the first
// non-empty line is "# <id>" and the directory is named id.
func checkSkills(contents map[string][]byte) ([]string, error) {
	var ids []string
	for p, b := range contents {
		parts := strings.Split(p, "/")
		if len(parts) != 3 || parts[0] != "skills" || parts[2] != "SKILL.md" {
			continue
		}
		id := parts[1]
		if !skillID.MatchString(id) {
			return nil, fmt.Errorf("%w: skill directory %q is not a valid id", ErrInvalidTree, id)
		}
		first := ""
		for _, line := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(line) != "" {
				first = strings.TrimSpace(line)
				break
			}
		}
		if first != "# "+id {
			return nil, fmt.Errorf("%w: %s must start with the line %q, not %q", ErrInvalidTree, p, "# "+id, first)
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func hashFiles(files []File) string {
	b, _ := json.Marshal(files)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// components fingerprints each part of the tree.
func components(files []File) Components {
	var docs, hooks, skills, env []File
	for _, f := range files {
		switch {
		case strings.HasPrefix(f.Path, "klbr_hooks/"), f.Path == "settings.toml", strings.HasPrefix(f.Path, "tests/"):
			// settings and the behavior's own tests belong to the hooks: only
			// hooks read settings, and a new hook worker is cheap.
			hooks = append(hooks, f)
		case strings.HasPrefix(f.Path, "skills/"), strings.HasPrefix(f.Path, "klbr_skills/"):
			skills = append(skills, f)
		case !strings.Contains(f.Path, "/") && path.Ext(f.Path) == ".md",
			strings.HasPrefix(f.Path, profiles.Dir+"/"):
			// Profiles are read at each spawn, like documents at each
			// model request: no process needs replacing.
			docs = append(docs, f)
		default:
			env = append(env, f)
		}
	}
	return Components{Documents: hashFiles(docs), Hooks: hashFiles(hooks), Skills: hashFiles(skills), Environment: hashFiles(env)}
}

// Kind is what activating a release over another needs.
type Kind string

// Activation kinds.
const (
	KindNone      Kind = "none"      // identical content
	KindPrompt    Kind = "prompt"    // documents only: no process replaced
	KindHooks     Kind = "hooks"     // hooks (and maybe documents): a new hook worker, the workbench stays
	KindWorkbench Kind = "workbench" // skills or environment: a new workbench generation too
)

// ActivationKind compares two manifests' components.
func ActivationKind(from, to Components) Kind {
	switch {
	case from == to:
		return KindNone
	case from.Skills != to.Skills || from.Environment != to.Environment:
		return KindWorkbench
	case from.Hooks != to.Hooks:
		return KindHooks
	default:
		return KindPrompt
	}
}

// Releases is the release directory, <data>/releases.
type Releases struct{ dir string }

// Open returns the release directory, creating it.
func Open(dir string) (*Releases, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("releases: %w", err)
	}
	return &Releases{dir: dir}, nil
}

// Dir is where release id lives; its tree is Dir(id)/tree.
func (r *Releases) Dir(id string) string { return filepath.Join(r.dir, id) }

// Tree is the directory holding release id's files.
func (r *Releases) Tree(id string) string { return filepath.Join(r.dir, id, "tree") }

var hexID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Publish scans fsys and stores it as an immutable release, or returns the
// release already stored with the same content (after verifying it).
func (r *Releases) Publish(fsys fs.FS) (Manifest, error) {
	m, contents, err := Scan(fsys)
	if err != nil {
		return m, err
	}
	if _, err := os.Stat(r.Dir(m.ID)); err == nil {
		if _, err := r.Verify(m.ID); err == nil {
			return m, nil
		}
		// A corrupt copy of the same content: replace it.
		makeWritable(r.Dir(m.ID))
		if err := os.RemoveAll(r.Dir(m.ID)); err != nil {
			return m, fmt.Errorf("releases: replace corrupt %s: %w", m.ID, err)
		}
	}
	tmp, err := os.MkdirTemp(r.dir, ".publish-")
	if err != nil {
		return m, fmt.Errorf("releases: %w", err)
	}
	defer func() { makeWritable(tmp); os.RemoveAll(tmp) }()
	for _, f := range m.Files {
		dst := filepath.Join(tmp, "tree", filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return m, err
		}
		if err := writeSynced(dst, contents[f.Path], 0o444); err != nil {
			return m, err
		}
	}
	mb, _ := json.MarshalIndent(m, "", "  ")
	if err := writeSynced(filepath.Join(tmp, "manifest.json"), mb, 0o444); err != nil {
		return m, err
	}
	if err := syncTree(tmp); err != nil {
		return m, err
	}
	if err := os.Rename(tmp, r.Dir(m.ID)); err != nil {
		return m, fmt.Errorf("releases: %w", err)
	}
	if err := syncDir(r.dir); err != nil {
		return m, err
	}
	return m, nil
}

// Verify reads release id back and checks every byte against its manifest,
// and the manifest against its id.
func (r *Releases) Verify(id string) (Manifest, error) {
	var m Manifest
	if !hexID.MatchString(id) {
		return m, fmt.Errorf("%w: %q is not a release id", ErrCorrupt, id)
	}
	b, err := os.ReadFile(filepath.Join(r.Dir(id), "manifest.json"))
	if err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrCorrupt, id, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, id, err)
	}
	if m.ID != id || hashFiles(m.Files) != id {
		return m, fmt.Errorf("%w: %s: the manifest names another release", ErrCorrupt, id)
	}
	got, _, err := Scan(os.DirFS(r.Tree(id)))
	if err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrCorrupt, id, err)
	}
	if got.ID != id {
		return m, fmt.Errorf("%w: %s: the files on disk hash to %s", ErrCorrupt, id, got.ID)
	}
	return m, nil
}

// List returns the ids of the stored releases.
func (r *Releases) List() ([]string, error) {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && hexID.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// MinPrefix is the fewest hex digits of a release id Resolve takes as a prefix.
const MinPrefix = 6

var hexPrefix = regexp.MustCompile(`^[0-9a-f]+$`)

// Resolve accepts a release id, a path to a release directory under dir, or
// a prefix of MinPrefix or more hex digits that starts one stored release
// id only; an ambiguous prefix is refused with the ids it could mean.
func (r *Releases) Resolve(ref string) (string, error) {
	if hexID.MatchString(ref) {
		return ref, nil
	}
	clean := filepath.Clean(ref)
	if filepath.Dir(clean) == filepath.Clean(r.dir) && hexID.MatchString(filepath.Base(clean)) {
		return filepath.Base(clean), nil
	}
	if !hexPrefix.MatchString(ref) {
		return "", fmt.Errorf("%q is neither a release id nor a directory in %s", ref, r.dir)
	}
	if len(ref) < MinPrefix {
		return "", fmt.Errorf("%q is too short to name a release: give at least %d hex digits of its id", ref, MinPrefix)
	}
	ids, err := r.List()
	if err != nil {
		return "", fmt.Errorf("resolve release %s: %w", ref, err)
	}
	var found []string
	for _, id := range ids {
		if strings.HasPrefix(id, ref) {
			found = append(found, id)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no stored release starts with %q (klbr-core releases lists them)", ref)
	}
	short := make([]string, len(found))
	for i, id := range found {
		short[i] = id[:min(len(id), len(ref)+6)]
	}
	return "", fmt.Errorf("%q starts %d stored releases (%s); give more of the id", ref, len(found), strings.Join(short, ", "))
}

func writeSynced(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncTree syncs every directory under root and makes them read-only.
func syncTree(root string) error {
	var dirs []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
		if dirs[i] != root {
			if err := os.Chmod(dirs[i], 0o555); err != nil {
				return err
			}
		}
	}
	return os.Chmod(root, 0o555)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func makeWritable(root string) {
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o755)
		}
		return nil
	})
}
