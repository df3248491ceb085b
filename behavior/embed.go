// Package behavior carries the default behavior tree (this directory) inside
// klbr-core. The daemon publishes it as a release when a session has none.
// KLBR_BEHAVIOR_DIR points at an editable copy instead, for development.
package behavior

import (
	"embed"
	"io/fs"
	"strings"
)

//go:embed all:*
var tree embed.FS

// Tree is the embedded default behavior tree, without build litter
// (__pycache__ directories a local test run may have left).
func Tree() fs.FS { return litterFree{tree} }

type litterFree struct{ fs.FS }

func hidden(name string) bool {
	return strings.Contains("/"+name+"/", "/__pycache__/")
}

func (l litterFree) Open(name string) (fs.File, error) {
	if hidden(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return l.FS.Open(name)
}

func (l litterFree) ReadDir(name string) ([]fs.DirEntry, error) {
	ents, err := fs.ReadDir(l.FS, name)
	out := ents[:0]
	for _, e := range ents {
		if e.Name() != "__pycache__" {
			out = append(out, e)
		}
	}
	return out, err
}
