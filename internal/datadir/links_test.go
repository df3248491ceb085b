package datadir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/uidtest"
)

// craft makes a real backup of a data directory holding a managed skill
// and returns it with its manifest, to be altered by an attacker.
func craft(t *testing.T) (dest string, m Manifest) {
	t.Helper()
	src := newDataDir(t)
	os.MkdirAll(filepath.Join(src, "skills", "notes"), 0o755)
	writeFile(t, filepath.Join(src, "skills", "notes", "SKILL.md"), "# notes\n")
	dest = filepath.Join(t.TempDir(), "b")
	if _, err := Backup(context.Background(), BackupOptions{DataDir: src}, dest); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(dest)
	if err != nil {
		t.Fatal(err)
	}
	return dest, m
}

func rewriteManifest(t *testing.T, dest string, m Manifest) {
	t.Helper()
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dest, ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// outsideFile is a file outside the backup whose content the attacker
// knows (so the manifest's hash matches it), standing for any file the
// restoring user may read and the attacker may not.
func outsideFile(t *testing.T) (path, sum string, size int64) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "shadow")
	body := "# notes\nroot:$6$known-to-the-attacker\n"
	writeFile(t, path, body)
	s := sha256.Sum256([]byte(body))
	return path, hex.EncodeToString(s[:]), int64(len(body))
}

// A backup is outside input: a link in it, in its manifest or on disk,
// is refused, never followed nor recreated; and so is a hard link.
func TestRestoreRefusesLinks(t *testing.T) { restoreRefusesLinks(t) }

// TestRestoreRefusesLinksUnprivilegedChild is TestRestoreRefusesLinks in
// a process of an unprivileged uid.
func TestRestoreRefusesLinksUnprivilegedChild(t *testing.T) {
	uidtest.Child(t, "TestRestoreRefusesLinksUnprivileged")
	restoreRefusesLinks(t)
}

// TestRestoreRefusesLinks with `klbr-core restore` run as an unprivileged
// uid (uidtest.Host, no capability): the data directories, the backup and
// the file its links lead to (0600: only that uid reads it) are its own.
func TestRestoreRefusesLinksUnprivileged(t *testing.T) {
	uidtest.Run(t, "TestRestoreRefusesLinksUnprivilegedChild", uidtest.Host, uidtest.Host)
}

func restoreRefusesLinks(t *testing.T) {
	const skill = "skills/notes/SKILL.md"
	cases := []struct {
		name  string
		alter func(t *testing.T, dest string, m *Manifest)
	}{
		{"a link in the manifest", func(t *testing.T, dest string, m *Manifest) {
			m.Files = append(m.Files, File{Path: "drafts/x/tree/soul.md", Link: "/etc/shadow", Mode: 0o777})
		}},
		{"a file that is a link on disk", func(t *testing.T, dest string, m *Manifest) {
			out, sum, size := outsideFile(t)
			p := filepath.Join(dest, filepath.FromSlash(skill))
			os.Remove(p)
			if err := os.Symlink(out, p); err != nil {
				t.Fatal(err)
			}
			setFile(m, skill, sum, size)
		}},
		{"a directory that is a link on disk", func(t *testing.T, dest string, m *Manifest) {
			out, sum, size := outsideFile(t)
			dir := filepath.Join(t.TempDir(), "notes")
			os.Mkdir(dir, 0o755)
			os.Rename(out, filepath.Join(dir, "SKILL.md"))
			p := filepath.Join(dest, "skills", "notes")
			os.RemoveAll(p)
			if err := os.Symlink(dir, p); err != nil {
				t.Fatal(err)
			}
			setFile(m, skill, sum, size)
		}},
		{"a hard link to a file outside", func(t *testing.T, dest string, m *Manifest) {
			out, sum, size := outsideFile(t)
			p := filepath.Join(dest, filepath.FromSlash(skill))
			os.Remove(p)
			if err := os.Link(out, p); err != nil {
				t.Fatal(err)
			}
			setFile(m, skill, sum, size)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dest, m := craft(t)
			c.alter(t, dest, &m)
			rewriteManifest(t, dest, m)
			target := filepath.Join(t.TempDir(), "r")
			_, err := Restore(context.Background(), dest, target)
			if err == nil {
				b, _ := os.ReadFile(filepath.Join(target, filepath.FromSlash(skill)))
				l, _ := os.Readlink(filepath.Join(target, "drafts", "x", "tree", "soul.md"))
				t.Fatalf("restored (skill %q, link %q); want refused", b, l)
			}
			if !strings.Contains(err.Error(), "link") {
				t.Fatalf("error %q does not say it is a link", err)
			}
			if ents, _ := os.ReadDir(target); len(ents) != 0 {
				t.Fatalf("a refused restore left %d entries", len(ents))
			}
		})
	}
}

func setFile(m *Manifest, path, sum string, size int64) {
	for i := range m.Files {
		if m.Files[i].Path == path {
			m.Files[i].SHA256, m.Files[i].Size = sum, size
		}
	}
}

// A link a cell made in its draft is not carried into a backup (it is
// reported), and the draft's files are.
func TestBackupCarriesNoLinks(t *testing.T) {
	src := newDataDir(t)
	tree := filepath.Join(src, "drafts", "d1", "tree")
	os.MkdirAll(tree, 0o755)
	writeFile(t, filepath.Join(tree, "soul.md"), "soul\n")
	if err := os.Symlink("/etc/passwd", filepath.Join(tree, "passwd")); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "b")
	res, err := Backup(context.Background(), BackupOptions{DataDir: src}, dest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "drafts", "d1", "tree", "passwd")); err == nil {
		t.Fatal("the link was carried into the backup")
	}
	if len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "drafts/d1/tree/passwd") {
		t.Fatalf("skipped %v", res.Skipped)
	}
	if _, err := Restore(context.Background(), dest, filepath.Join(t.TempDir(), "r")); err != nil {
		t.Fatal(err)
	}
}
