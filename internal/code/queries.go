package code

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// QueryDir is where a behavior tree keeps its queries:
// queries/<language>/<name>.scm. They are ordinary files of the release,
// so a new or improved query is a behavior change, not a host change.
const QueryDir = "queries"

var queryName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// ErrMissingQuery marks a named query the language does not have in the release.
var ErrMissingQuery = errors.New("no such query")

// QueryFile is the path of a named query in a behavior tree.
func QueryFile(lang, name string) string { return path.Join(QueryDir, lang, name+".scm") }

// Available lists the named queries a tree has for lang.
func Available(tree fs.FS, lang string) []string {
	ents, _ := fs.ReadDir(tree, path.Join(QueryDir, lang))
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".scm"); ok && e.Type().IsRegular() && queryName.MatchString(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// cache keeps compiled queries of release files by language and content:
// release files are immutable, and compiling a large query takes
// milliseconds. It stops growing at maxCached (later ones compile per
// request), so it never holds more than a bounded number of C queries.
type cache struct {
	mu sync.Mutex
	m  map[[32]byte]*Query
}

const maxCached = 512

func (c *cache) load(tree fs.FS, treeName string, l *Language, name string) (*Query, error) {
	if l.TextOnly {
		return nil, NoGrammar(l)
	}
	if !queryName.MatchString(name) {
		return nil, fmt.Errorf("%q is not a query name (lowercase letters, digits, _)", name)
	}
	file := QueryFile(l.Name, name)
	b, err := fs.ReadFile(tree, file)
	if errors.Is(err, fs.ErrNotExist) {
		have := Available(tree, l.Name)
		list := "none"
		if len(have) > 0 {
			list = strings.Join(have, ", ")
		}
		return nil, fmt.Errorf("%w: the behavior release (%s) has no %s, so %s has no %q query (its queries: %s); "+
			"this is not an empty result", ErrMissingQuery, treeName, file, l.Name, name, list)
	}
	if err != nil {
		return nil, err
	}
	key := sha256.Sum256(append([]byte(l.Name+"\x00"+file+"\x00"), b...))
	c.mu.Lock()
	q := c.m[key]
	c.mu.Unlock()
	if q != nil {
		return q, nil
	}
	q, err = Compile(l, name, file, string(b))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev := c.m[key]; prev != nil {
		q.Close()
		return prev, nil
	}
	if c.m == nil {
		c.m = map[[32]byte]*Query{}
	}
	if len(c.m) < maxCached {
		q.own = false
		c.m[key] = q
	}
	return q, nil
}
