package behavior

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/klbr-dev/klbr/internal/celltree"
)

// SkillRoot is one place skills are read from: builtin (the active
// release's skills/) or managed (<data>/skills, which survives releases).
type SkillRoot struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// Package, when set, is a klbr_skills/ directory whose modules this root
	// offers (the release's). Without it, a skill directory of this root that
	// holds an __init__.py is itself the module klbr_skills.<id> (managed).
	Package string `json:"package,omitempty"`
}

// SkillRoots are where a session's skills are read from, in order: a
// release tree's skills/ and klbr_skills/ ("builtin"; none when tree is
// ""), the operator's KLBR_SKILLS_DIR when set, then <dataDir>/skills
// ("managed"). They are one namespace: an id in two is refused in both.
func SkillRoots(tree, skillsDir, dataDir string) []SkillRoot {
	var roots []SkillRoot
	if tree != "" {
		roots = append(roots, SkillRoot{Name: "builtin", Dir: filepath.Join(tree, "skills"), Package: filepath.Join(tree, "klbr_skills")})
	}
	if skillsDir != "" {
		roots = append(roots, SkillRoot{Name: "KLBR_SKILLS_DIR", Dir: skillsDir})
	}
	return append(roots, SkillRoot{Name: "managed", Dir: filepath.Join(dataDir, "skills")})
}

// SkillSet is what one workbench generation is offered: read and validated
// by the host once, handed to the worker at spawn, unchanging under it.
type SkillSet struct {
	Revision string            `json:"revision"`
	Roots    []string          `json:"roots"`
	Skills   map[string]string `json:"skills"`
	Refused  map[string]string `json:"refused"`
	// Modules are the importable klbr_skills.<name> modules, each with the
	// first line of its docstring.
	Modules map[string]string `json:"modules"`
	// Path is the directory holding the staged klbr_skills package (see
	// Stage), put on the generation's PYTHONPATH; "" when there is none.
	Path string `json:"path,omitempty"`
	// Site is the release's staged dependency environment, also put on the
	// generation's import path; "" when it declares none.
	Site string `json:"site,omitempty"`

	files map[string][]byte // the klbr_skills package: path under it → bytes
}

// LoadSkills reads skills/<id>/SKILL.md from each root. A skill whose
// heading does not match its directory, or whose id appears in two roots,
// is refused with the reason instead of silently winning.
func LoadSkills(roots []SkillRoot) (SkillSet, error) {
	set := SkillSet{Skills: map[string]string{}, Refused: map[string]string{}, Modules: map[string]string{}, files: map[string][]byte{}}
	from := map[string]string{}
	mods := modules{from: map[string]string{}, files: map[string]map[string][]byte{}, refused: set.Refused}
	for _, r := range roots {
		if r.Package != "" {
			if err := mods.addPackage(r.Name, r.Package); err != nil {
				return set, err
			}
		}
		set.Roots = append(set.Roots, r.Dir)
		// A skills directory may be one a cell writes (<data>/skills, an
		// operator's KLBR_SKILLS_DIR): it is read beneath its descriptor with
		// no link followed, every file bounded (internal/celltree).
		root, err := celltree.Open(r.Dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return set, fmt.Errorf("skills: %w", err)
		}
		fsys := root.FS(MaxFileBytes)
		ents, err := fs.ReadDir(fsys, ".")
		if err != nil {
			root.Close()
			return set, fmt.Errorf("skills: %w", err)
		}
		for _, e := range ents {
			id := e.Name()
			if !e.IsDir() || strings.HasPrefix(id, ".") {
				continue
			}
			body, err := readSkill(fsys, id)
			switch {
			case err != nil:
				set.Refused[id] = fmt.Sprintf("%s: %v", r.Name, err)
			case from[id] != "":
				set.Refused[id] = fmt.Sprintf("defined in both %s and %s", from[id], r.Name)
				delete(set.Skills, id)
			case set.Refused[id] != "":
			default:
				set.Skills[id] = body
				from[id] = r.Name
			}
			if r.Package == "" && from[id] == r.Name {
				mods.addManaged(fsys, r.Name, id)
			}
		}
		root.Close()
	}
	mods.finish(&set)
	ids := make([]string, 0, len(set.Skills))
	for id := range set.Skills {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	h := sha256.New()
	for _, id := range ids {
		b, _ := json.Marshal([]string{id, set.Skills[id]})
		h.Write(b)
	}
	paths := make([]string, 0, len(set.files))
	for p := range set.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		sum := sha256.Sum256(set.files[p])
		b, _ := json.Marshal([]string{"klbr_skills/" + p, hex.EncodeToString(sum[:])})
		h.Write(b)
	}
	set.Revision = hex.EncodeToString(h.Sum(nil))
	return set, nil
}

// readSkill reads <id>/SKILL.md of fsys: a regular file (no link) within
// MaxFileBytes whose first non-empty line is "# <id>".
func readSkill(fsys fs.FS, id string) (string, error) {
	if !skillID.MatchString(id) {
		return "", fmt.Errorf("%q is not a valid skill id", id)
	}
	b, err := fs.ReadFile(fsys, id+"/SKILL.md")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("no SKILL.md")
	case errors.Is(err, celltree.ErrTooLarge):
		return "", fmt.Errorf("SKILL.md is over %d bytes", MaxFileBytes)
	case errors.Is(err, celltree.ErrLink), errors.Is(err, celltree.ErrNotRegular), errors.Is(err, celltree.ErrHardLink):
		return "", fmt.Errorf("SKILL.md is not a regular file: %w", err)
	case err != nil:
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.TrimSpace(line) != "# "+id {
			return "", fmt.Errorf("the first line is %q, want %q", strings.TrimSpace(line), "# "+id)
		}
		return string(b), nil
	}
	return "", fmt.Errorf("SKILL.md is empty")
}

// Bounds of the skill index a contract message carries.
const (
	IndexMaxEntries = 64
	IndexMaxBytes   = 4 << 10
)

// Index is the bounded index of the set for the model's contract message:
// one line per skill id (its first line after the title) and per
// klbr_skills module (its docstring's first line), then the refusals. What
// does not fit is counted, never silently dropped.
func (s SkillSet) Index() string {
	var lines []string
	ids := make([]string, 0, len(s.Skills))
	for id := range s.Skills {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		lines = append(lines, "- "+id+": "+summary(s.Skills[id]))
	}
	mods := make([]string, 0, len(s.Modules))
	for m := range s.Modules {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	for _, m := range mods {
		line := "- klbr_skills." + m
		if s.Modules[m] != "" {
			line += ": " + s.Modules[m]
		}
		lines = append(lines, line)
	}
	var b strings.Builder
	b.WriteString("## Skill index\n\nRead one with `help(skills.<id>)` after `import klbr.skills as skills`; " +
		"use code with `import klbr_skills.<name>`. The set is fixed for this workbench generation.\n")
	if len(lines) == 0 {
		b.WriteString("(none offered)\n")
	}
	for i, line := range lines {
		if i >= IndexMaxEntries || b.Len()+len(line)+1 > IndexMaxBytes-160 {
			fmt.Fprintf(&b, "(%d more not listed: dir(skills))\n", len(lines)-i)
			break
		}
		b.WriteString(line + "\n")
	}
	if len(s.Refused) > 0 {
		refused := make([]string, 0, len(s.Refused))
		for id := range s.Refused {
			refused = append(refused, id)
		}
		sort.Strings(refused)
		fmt.Fprintf(&b, "Refused (skills.refused says why): %s\n", oneLine(strings.Join(refused, ", ")))
	}
	return strings.TrimRight(b.String(), "\n")
}

// summary is a SKILL.md body's first non-empty line after its title.
func summary(body string) string {
	lines := strings.Split(body, "\n")
	seenTitle := false
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !seenTitle && strings.HasPrefix(line, "# ") {
			seenTitle = true
			continue
		}
		return oneLine(line)
	}
	return ""
}
