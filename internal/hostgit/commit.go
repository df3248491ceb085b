package hostgit

import (
	"bytes"
	"context"
	"fmt"
	"strings"
)

// File is one file of a tree the host read itself.
type File struct {
	Path string // slash path inside the tree
	Data []byte // the content; a link's target
	Exec bool   // an executable file: git mode 100755
	// Link: a symbolic link to Data (git mode 120000). git stores the
	// target as a blob: nothing follows it, here or in the diff.
	Link bool
}

// mode is f's git mode.
func (f File) mode() string {
	switch {
	case f.Link:
		return "120000"
	case f.Exec:
		return "100755"
	}
	return "100644"
}

// Commit writes files as one root commit per tree into repo (a repository
// the host made: Scratch) under refs/heads/<name> for each name of trees,
// in one git fast-import, and returns the commits by name. git never opens
// the directory the files came from: the host read them (see the package
// comment), so nothing there (a .git, .gitattributes, a link) reaches git.
func (g *Git) Commit(ctx context.Context, repo string, trees map[string][]File) (map[string]string, error) {
	var in bytes.Buffer
	names := make([]string, 0, len(trees))
	for name := range trees {
		names = append(names, name)
	}
	for i, name := range names {
		fmt.Fprintf(&in, "commit refs/heads/%s\nmark :%d\ncommitter klbr <klbr@localhost> 0 +0000\ndata 0\ndeleteall\n", name, i+1)
		for _, f := range trees[name] {
			fmt.Fprintf(&in, "M %s inline %s\ndata %d\n", f.mode(), quote(f.Path), len(f.Data))
			in.Write(f.Data)
			in.WriteByte('\n')
		}
		in.WriteByte('\n')
	}
	for i := range names {
		fmt.Fprintf(&in, "get-mark :%d\n", i+1)
	}
	in.WriteString("done\n")
	out, err := g.Run(ctx, Cmd{GitDir: repo, Stdin: &in}, "fast-import", "--quiet", "--done", "--date-format=raw")
	if err != nil {
		return nil, err
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(names) {
		return nil, fmt.Errorf("git fast-import: %d commits for %d trees: %q", len(lines), len(names), out)
	}
	commits := make(map[string]string, len(names))
	for i, name := range names {
		commits[name] = lines[i]
	}
	return commits, nil
}

// quote is path in fast-import's C-style quoting, which takes any byte.
func quote(p string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
