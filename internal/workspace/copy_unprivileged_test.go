package workspace

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klbr-dev/klbr/internal/uidtest"
)

// hostSecret is the operator token of an unprivileged klbr-core: a file
// of uidtest.Host's, 0600 in a 0700 directory, that no other uid (the
// cell's included) can read.
func hostSecret(t *testing.T) (dir, file string) {
	t.Helper()
	dir = uidtest.Dir(t, uidtest.Host, uidtest.Host, 0o700)
	_, _, value := secretOutside(t) // its random value; the file is root's
	file = filepath.Join(dir, "operator-token")
	if err := os.WriteFile(file, value, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, uidtest.Host, uidtest.Host); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// cellWorkspace is a directory of the cell's uid, reachable by every uid.
func cellWorkspace(t *testing.T) string {
	t.Helper()
	return uidtest.Dir(t, uidtest.Cell, uidtest.Cell, 0o755)
}

const (
	envRaceRoots = "KLBR_TEST_RACE_ROOTS" // the workspaces to copy, by filepath.ListSeparator
	envSecret    = "KLBR_TEST_SECRET_FILE"
	envCases     = "KLBR_TEST_OUTSIDE_CASES" // JSON: [{name, root, fails}]
)

// TestCopyRaceSwapsAFileForALinkUnprivilegedChild is klbr-core as an
// unprivileged uid copying each workspace while the cell swaps.
func TestCopyRaceSwapsAFileForALinkUnprivilegedChild(t *testing.T) {
	uidtest.Child(t, "TestCopyRaceSwapsAFileForALinkUnprivileged")
	secret, err := os.ReadFile(os.Getenv(envSecret))
	if err != nil {
		t.Fatalf("the host cannot read its own token: %v", err)
	}
	leaked := 0
	for _, root := range filepath.SplitList(os.Getenv(envRaceRoots)) {
		if !copyLeaksNothing(t, root, filepath.Join(t.TempDir(), "worktrees"), secret) {
			leaked++
		}
	}
	if leaked > 0 {
		t.Errorf("%d copies leaked", leaked)
	}
}

// The swap attack of TestCopyRaceSwapsAFileForALink with klbr-core
// unprivileged (uidtest.Host, no capability) and the workspace and the
// swap the cell's (uidtest.Cell, acting on files as that uid): the token
// is the host's own 0600 file, which the cell cannot read but the host
// can. 20 runs, each timed with inotify.
func TestCopyRaceSwapsAFileForALinkUnprivileged(t *testing.T) {
	requireGit(t)
	uidtest.Root(t)
	secretDir, secretFile := hostSecret(t)
	var roots []string
	var waits []func() bool
	for range 20 {
		root := cellWorkspace(t)
		fillRaceTree(t, root)
		uidtest.Chown(t, root, uidtest.Cell, uidtest.Cell)
		roots = append(roots, root)
		waits = append(waits, swapWhenOpened(t, root, secretFile, secretDir, uidtest.Cell))
	}
	uidtest.Run(t, "TestCopyRaceSwapsAFileForALinkUnprivilegedChild", uidtest.Host, uidtest.Host,
		envRaceRoots+"="+strings.Join(roots, string(filepath.ListSeparator)), envSecret+"="+secretFile)
	swaps := 0
	for _, wait := range waits {
		if wait() {
			swaps++
		}
	}
	if swaps == 0 {
		t.Fatal("the swap never happened: the test proves nothing")
	}
	t.Logf("%d of 20 runs swapped during the copy", swaps)
}

type outsideRun struct {
	Name  string `json:"name"`
	Root  string `json:"root"`
	Fails bool   `json:"fails"`
}

// TestCopyRefusesWhatLeadsOutsideUnprivilegedChild copies each case's
// workspace as an unprivileged klbr-core.
func TestCopyRefusesWhatLeadsOutsideUnprivilegedChild(t *testing.T) {
	uidtest.Child(t, "TestCopyRefusesWhatLeadsOutsideUnprivileged")
	secret, err := os.ReadFile(os.Getenv(envSecret))
	if err != nil {
		t.Fatalf("the host cannot read its own token: %v", err)
	}
	var runs []outsideRun
	if err := json.Unmarshal([]byte(os.Getenv(envCases)), &runs); err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		t.Run(r.Name, func(t *testing.T) {
			checkOutsideCopy(t, r.Root, filepath.Join(t.TempDir(), "worktrees"), r.Fails, secret)
		})
	}
}

// TestCopyRefusesWhatLeadsOutside with klbr-core unprivileged
// (uidtest.Host), the workspace the cell's (uidtest.Cell) and every link
// and hard link leading to the host's own 0600 token.
func TestCopyRefusesWhatLeadsOutsideUnprivileged(t *testing.T) {
	requireGit(t)
	uidtest.Root(t)
	secretDir, secretFile := hostSecret(t)
	var runs []outsideRun
	for _, c := range outsideCases(secretDir, secretFile) {
		root := cellWorkspace(t)
		write(t, filepath.Join(root, "notes.txt"), "root\n")
		os.Symlink("notes.txt", filepath.Join(root, "inside"))
		uidtest.Chown(t, root, uidtest.Cell, uidtest.Cell) // before the case: a hard link is the token's inode
		if err := c.make(t, root); err != nil {
			if errors.Is(err, syscall.EPERM) {
				t.Logf("%s: cannot make it here: %v", c.name, err)
				continue
			}
			t.Fatal(err)
		}
		runs = append(runs, outsideRun{c.name, root, c.fails})
	}
	b, _ := json.Marshal(runs)
	uidtest.Run(t, "TestCopyRefusesWhatLeadsOutsideUnprivilegedChild", uidtest.Host, uidtest.Host,
		envCases+"="+string(b), envSecret+"="+secretFile)
}
