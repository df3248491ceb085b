package datadir

import (
	"io/fs"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/store"
)

// privateMode is the mode of a file that holds secrets or history, wherever
// a backup or a restore writes it: the database, the tokens, klbr.toml and
// the manifest are 0600; an artifact (a cell's output) keeps its owner's
// bits (0400 as the store writes it) and loses every group and other bit.
// ok is false for the other files (releases, drafts, skills), which keep the
// mode the manifest records.
func privateMode(rel string, mode fs.FileMode) (_ fs.FileMode, ok bool) {
	switch {
	case rel == store.FileName || slices.Contains(Secrets, rel) || rel == "klbr.toml" || rel == ManifestName:
		return 0o600, true
	case strings.HasPrefix(rel, "artifacts/"):
		if p := mode.Perm() & 0o700; p != 0 {
			return p, true
		}
		return 0o400, true
	}
	return 0, false
}

// restoreMode is the mode Restore writes rel with, from the manifest's mode:
// a backup's manifest cannot make a file holding secrets or history
// readable by others.
func restoreMode(rel string, mode fs.FileMode) fs.FileMode {
	if p, ok := privateMode(rel, mode); ok {
		return p
	}
	return mode.Perm()
}

// backupMode is the mode of rel's copy in a backup: a private file's mode,
// and every other file without group and other bits (a backup is read by
// its owner; the manifest records the mode a restore gives back).
func backupMode(rel string, mode fs.FileMode) fs.FileMode {
	if p, ok := privateMode(rel, mode); ok {
		return p
	}
	return mode.Perm() &^ 0o077
}
