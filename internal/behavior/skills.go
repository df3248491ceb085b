package behavior

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SkillRoot is one place skills are read from: builtin (the active
// release's skills/) or managed (<data>/skills, which survives releases).
type SkillRoot struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
}

// SkillSet is what one workbench generation is offered: read and validated
// by the host once, handed to the worker at spawn, unchanging under it.
type SkillSet struct {
	Revision string            `json:"revision"`
	Roots    []string          `json:"roots"`
	Skills   map[string]string `json:"skills"`
	Refused  map[string]string `json:"refused"`
}

// LoadSkills reads skills/<id>/SKILL.md from each root. A skill whose
// heading does not match its directory, or whose id appears in two roots,
// is refused with the reason instead of silently winning.
func LoadSkills(roots []SkillRoot) (SkillSet, error) {
	set := SkillSet{Skills: map[string]string{}, Refused: map[string]string{}}
	from := map[string]string{}
	for _, r := range roots {
		set.Roots = append(set.Roots, r.Dir)
		ents, err := os.ReadDir(r.Dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return set, fmt.Errorf("skills: %w", err)
		}
		for _, e := range ents {
			id := e.Name()
			if !e.IsDir() || strings.HasPrefix(id, ".") {
				continue
			}
			body, err := readSkill(filepath.Join(r.Dir, id, "SKILL.md"), id)
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
		}
	}
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
	set.Revision = hex.EncodeToString(h.Sum(nil))
	return set, nil
}

func readSkill(path, id string) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return "", fmt.Errorf("no SKILL.md")
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("SKILL.md is not a regular file")
	}
	if fi.Size() > MaxFileBytes {
		return "", fmt.Errorf("SKILL.md is over %d bytes", MaxFileBytes)
	}
	if !skillID.MatchString(id) {
		return "", fmt.Errorf("%q is not a valid skill id", id)
	}
	b, err := os.ReadFile(path)
	if err != nil {
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
