package behavior

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// The klbr_skills package a workbench generation imports is put together by
// the host from two roots: the release's klbr_skills/ directory (each
// <name>.py or <name>/ package is the module klbr_skills.<name>) and the
// managed skills, where a skill directory <data>/skills/<id>/ holding an
// __init__.py is the module klbr_skills.<id> (its top-level .py files).
// Both are one namespace: a module name offered by both is refused in both.
// The package is staged into its own content-addressed directory, so what a
// generation imports cannot change under it.

var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

type modules struct {
	from    map[string]string            // module → root name
	files   map[string]map[string][]byte // module → path under klbr_skills/ → bytes
	init    []byte                       // the release's klbr_skills/__init__.py
	refused map[string]string
}

func (m *modules) add(root, name string, files map[string][]byte) {
	switch {
	case m.from[name] == "-": // already refused as defined twice
	case m.from[name] != "":
		m.refused[name] = fmt.Sprintf("klbr_skills.%s is defined in both %s and %s", name, m.from[name], root)
		delete(m.files, name)
		m.from[name] = "-"
	default:
		m.from[name], m.files[name] = root, files
	}
}

// addPackage reads a klbr_skills/ directory (a release's: already bounded
// and free of symlinks and bytecode by its publication).
func (m *modules) addPackage(root, dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("skills: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if name == "__pycache__" || strings.HasPrefix(name, ".") {
			continue
		}
		if name == "__init__.py" {
			if m.init, err = readBounded(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("skills: %w", err)
			}
			continue
		}
		mod := strings.TrimSuffix(name, ".py")
		if !moduleName.MatchString(mod) || (!e.IsDir() && !strings.HasSuffix(name, ".py")) {
			continue // data files of the package are not modules; they are not copied either
		}
		files := map[string][]byte{}
		if e.IsDir() {
			err = filepath.WalkDir(filepath.Join(dir, name), func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if d.IsDir() && d.Name() == "__pycache__" {
					return fs.SkipDir
				}
				if !d.Type().IsRegular() {
					return nil
				}
				rel, _ := filepath.Rel(dir, p)
				b, err := readBounded(p)
				files[filepath.ToSlash(rel)] = b
				return err
			})
		} else {
			var b []byte
			b, err = readBounded(filepath.Join(dir, name))
			files[name] = b
		}
		if err != nil {
			m.refused[mod] = fmt.Sprintf("%s: klbr_skills.%s: %v", root, mod, err)
			continue
		}
		m.add(root, mod, files)
	}
	return nil
}

// addManaged offers skill id's directory of fsys as klbr_skills.<id> when
// it holds an __init__.py: its top-level regular .py files, within the
// bounds of a release. Anything that does not fit refuses the module with
// the reason. fsys follows no link (see LoadSkills).
func (m *modules) addManaged(fsys fs.FS, root, id string) {
	if fi, err := fs.Stat(fsys, id+"/__init__.py"); err != nil || !fi.Mode().IsRegular() {
		return
	}
	if !moduleName.MatchString(id) {
		m.refused[id] = fmt.Sprintf("%s: %q carries Python but is not a Python identifier (klbr_skills.<id> must be importable)", root, id)
		return
	}
	ents, err := fs.ReadDir(fsys, id)
	if err != nil {
		m.refused[id] = fmt.Sprintf("%s: %v", root, err)
		return
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".py") {
			continue
		}
		if !e.Type().IsRegular() || !pathPart.MatchString(e.Name()) {
			m.refused[id] = fmt.Sprintf("%s: %s is not a regular file with an allowed name", root, e.Name())
			return
		}
		b, err := fs.ReadFile(fsys, id+"/"+e.Name())
		if err == nil && len(files) >= MaxTreeFiles {
			err = fmt.Errorf("over %d files", MaxTreeFiles)
		}
		if err != nil {
			m.refused[id] = fmt.Sprintf("%s: %s: %v", root, e.Name(), err)
			return
		}
		files[id+"/"+e.Name()] = b
	}
	m.add(root, id, files)
}

func readBounded(p string) ([]byte, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", filepath.Base(p))
	}
	if fi.Size() > MaxFileBytes {
		return nil, fmt.Errorf("%s is over %d bytes", filepath.Base(p), MaxFileBytes)
	}
	return os.ReadFile(p)
}

// finish puts the offered modules into set, bounded as a release is.
func (m *modules) finish(set *SkillSet) {
	names := make([]string, 0, len(m.files))
	for name := range m.files {
		names = append(names, name)
	}
	sort.Strings(names)
	var total int64
	for _, name := range names {
		var size int64
		for _, b := range m.files[name] {
			size += int64(len(b))
		}
		if total+size > MaxTreeBytes || len(set.files)+len(m.files[name]) > MaxTreeFiles {
			set.Refused[name] = fmt.Sprintf("%s: klbr_skills.%s does not fit: the package is over %d bytes or %d files", m.from[name], name, MaxTreeBytes, MaxTreeFiles)
			continue
		}
		total += size
		for p, b := range m.files[name] {
			set.files[p] = b
		}
		main := m.files[name][name+".py"]
		if main == nil {
			main = m.files[name][name+"/__init__.py"]
		}
		set.Modules[name] = DocLine(main)
	}
	if len(set.files) > 0 || m.init != nil {
		init := m.init
		if init == nil {
			init = []byte("\"\"\"Skills as code: klbr_skills.<name> modules offered by this generation.\"\"\"\n")
		}
		set.files["__init__.py"] = init
	}
}

// DocLine is the first line of a Python module's docstring, or "".
func DocLine(src []byte) string {
	s := strings.TrimLeft(string(src), " \t\r\n")
	for strings.HasPrefix(s, "#") { // comments and a coding line before the docstring
		_, rest, _ := strings.Cut(s, "\n")
		s = strings.TrimLeft(rest, " \t\r\n")
	}
	s = strings.TrimLeft(s, "rRuU")
	for _, q := range []string{`"""`, `'''`, `"`, `'`} {
		if strings.HasPrefix(s, q) {
			body, _, _ := strings.Cut(s[len(q):], q)
			for _, line := range strings.Split(body, "\n") {
				if line = strings.TrimSpace(line); line != "" {
					return oneLine(line)
				}
			}
			return ""
		}
	}
	return ""
}

func oneLine(s string) string {
	const limit = 100
	if r := []rune(s); len(r) > limit {
		return string(r[:limit-1]) + "…"
	}
	return s
}

// Stage writes set's klbr_skills package under dir/<revision>/klbr_skills,
// read-only, once per revision, and returns the directory to put on
// PYTHONPATH (dir/<revision>), or "" when the set has no Python.
func Stage(set SkillSet, dir string) (string, error) {
	if len(set.files) == 0 {
		return "", nil
	}
	if !hexID.MatchString(set.Revision) {
		return "", fmt.Errorf("skills: revision %q is not a content hash", set.Revision)
	}
	final := filepath.Join(dir, set.Revision)
	if _, err := os.Stat(filepath.Join(final, "klbr_skills", "__init__.py")); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("skills: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".stage-")
	if err != nil {
		return "", fmt.Errorf("skills: %w", err)
	}
	defer func() { makeWritable(tmp); os.RemoveAll(tmp) }()
	for p, b := range set.files {
		dst := filepath.Join(tmp, "klbr_skills", filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		if err := writeSynced(dst, b, 0o444); err != nil {
			return "", err
		}
	}
	if err := syncTree(tmp); err != nil {
		return "", err
	}
	os.Chmod(tmp, 0o555)
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "klbr_skills", "__init__.py")); serr == nil {
			return final, nil // staged by a concurrent generation start
		}
		return "", fmt.Errorf("skills: %w", err)
	}
	return final, nil
}
