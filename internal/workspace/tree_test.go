package workspace

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/celltree"
)

// tarOf builds an archive of entries, as a host's tar could send it.
func tarOf(t testing.TB, entries ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		body := strings.Repeat("x", int(h.Size))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	return b.Bytes()
}

// A host's archive is the host's word: names that climb out, are
// absolute or unclean refuse it; .git, links and devices are left out;
// its entries and bytes are bounded.
func TestReadTreeRefusesWhatCouldLeaveTheTree(t *testing.T) {
	lim := Limits{MaxFiles: 10, MaxBytes: 100}
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		want    []string // files read
		skipped int
		err     string
	}{
		{"plain", []tar.Header{{Name: "./", Typeflag: tar.TypeDir}, {Name: "./a.txt", Typeflag: tar.TypeReg, Size: 3},
			{Name: "./d/", Typeflag: tar.TypeDir}, {Name: "./d/b", Typeflag: tar.TypeReg, Size: 1}}, []string{"a.txt", "d/b"}, 0, ""},
		{"climbs out", []tar.Header{{Name: "../evil", Typeflag: tar.TypeReg, Size: 1}}, nil, 0, "not a plain relative name"},
		{"climbs out inside", []tar.Header{{Name: "./d/../../evil", Typeflag: tar.TypeReg, Size: 1}}, nil, 0, "not a plain relative name"},
		{"absolute", []tar.Header{{Name: "/etc/passwd", Typeflag: tar.TypeReg, Size: 1}}, nil, 0, "not a plain relative name"},
		{"unclean", []tar.Header{{Name: "a//b", Typeflag: tar.TypeReg, Size: 1}}, nil, 0, "not a plain relative name"},
		{"git left out", []tar.Header{{Name: "./.git/config", Typeflag: tar.TypeReg, Size: 2}, {Name: "./sub/.git/hooks/x", Typeflag: tar.TypeReg, Size: 2},
			{Name: "./ok", Typeflag: tar.TypeReg, Size: 1}}, []string{"ok"}, 0, ""},
		{"links and devices left out", []tar.Header{{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
			{Name: "./h", Typeflag: tar.TypeLink, Linkname: "ok"}, {Name: "./dev", Typeflag: tar.TypeChar}, {Name: "./ok", Typeflag: tar.TypeReg, Size: 1}},
			[]string{"ok"}, 3, ""},
		{"too many entries", func() []tar.Header {
			var hs []tar.Header
			for i := range 11 {
				hs = append(hs, tar.Header{Name: "f" + string(rune('a'+i)), Typeflag: tar.TypeReg})
			}
			return hs
		}(), nil, 0, "more than 10 entries"},
		{"too many bytes", []tar.Header{{Name: "a", Typeflag: tar.TypeReg, Size: 60}, {Name: "b", Typeflag: tar.TypeReg, Size: 60}}, nil, 0, "more than 100 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			skipped, err := readTree(bytes.NewReader(tarOf(t, tc.entries...)), lim, func(n string, _ []byte) error {
				got = append(got, n)
				return nil
			})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) || skipped != tc.skipped {
				t.Fatalf("read %v (skipped %d), %v; want %v (skipped %d)", got, skipped, err, tc.want, tc.skipped)
			}
		})
	}
}

// The copy sent to a host is read without following links: a link out of
// the workspace travels as nothing (its target's content never leaves),
// .git and the excluded data directory stay here, and what it reads back
// is what it packed.
func TestPackTreeFollowsNoLink(t *testing.T) {
	ws, outside := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	must(os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a"), 0o644))
	must(os.MkdirAll(filepath.Join(ws, ".git"), 0o755))
	must(os.WriteFile(filepath.Join(ws, ".git", "config"), []byte("[core]"), 0o644))
	must(os.MkdirAll(filepath.Join(ws, "data"), 0o755))
	must(os.WriteFile(filepath.Join(ws, "data", "klbr.db"), []byte("db"), 0o600))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(ws, "link")))
	must(os.Symlink(outside, filepath.Join(ws, "dirlink")))
	tree, skipped, err := packTree(ws, DefaultLimits, []string{filepath.Join(ws, "data")})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(tree.Tar, []byte("secret")) || bytes.Contains(tree.Tar, []byte("[core]")) || bytes.Contains(tree.Tar, []byte("klbr.db")) {
		t.Fatalf("the archive holds what it must not")
	}
	got := map[string]string{}
	if _, err := readTree(bytes.NewReader(tree.Tar), DefaultLimits, func(n string, d []byte) error { got[n] = string(d); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a.txt"] != "a" || skipped != 2 {
		t.Fatalf("packed %v, skipped %d", got, skipped)
	}
	again, _, err := packTree(ws, DefaultLimits, []string{filepath.Join(ws, "data")})
	if err != nil || again.Hash != tree.Hash {
		t.Fatalf("the same tree packed to another archive: %v", err)
	}
	if _, _, err := packTree(ws, Limits{MaxFiles: 1, MaxBytes: 1 << 20}, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the entry limit: %v", err)
	}
	// A hard link to a file outside (one a cell could not read, made by a
	// cell that could name it) refuses the pack (celltree's open refuses
	// it): its content never leaves.
	must(os.Link(filepath.Join(outside, "secret"), filepath.Join(ws, "hard")))
	if tree, _, err := packTree(ws, DefaultLimits, []string{filepath.Join(ws, "data")}); !errors.Is(err, celltree.ErrHardLink) || bytes.Contains(tree.Tar, []byte("secret")) {
		t.Fatalf("a hard link was packed: %v", err)
	}
}

// Any archive reads without a panic, within its bounds, and only ever
// yields plain relative names outside .git.
func FuzzReadTree(f *testing.F) {
	f.Add(tarOf(f, tar.Header{Name: "./a", Typeflag: tar.TypeReg, Size: 3}, tar.Header{Name: "./d/", Typeflag: tar.TypeDir}))
	f.Add(tarOf(f, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}))
	f.Add([]byte{})
	f.Add(tarOf(f, tar.Header{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, tar.Header{Name: "./l/x", Typeflag: tar.TypeReg, Size: 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		lim := Limits{MaxFiles: 50, MaxBytes: 1 << 16}
		total := 0
		readEntries(bytes.NewReader(b), lim, func(e treeEntry) error {
			n, d := e.Name, e.Data
			total += len(d)
			if n == "" || strings.HasPrefix(n, "/") || filepath.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") || hasGit(n) {
				t.Fatalf("yielded %q", n)
			}
			if e.Link && (len(d) == 0 || len(d) > maxTarName || bytes.IndexByte(d, 0) >= 0) {
				t.Fatalf("a link to %q", d)
			}
			return nil
		})
		if int64(total) > lim.MaxBytes {
			t.Fatalf("%d bytes past the bound", total)
		}
	})
}

// A patch's reader (readEntries) passes links on as links, their target
// text never followed, and each file's executable bit; a link's target is
// bounded, and a name beneath a link refuses the archive.
func TestReadEntriesLinksAndModes(t *testing.T) {
	lim := Limits{MaxFiles: 10, MaxBytes: 100}
	type got struct {
		name, data string
		exec, link bool
	}
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		want    []got
		err     string
	}{
		{"modes and links", []tar.Header{{Name: "./run.sh", Typeflag: tar.TypeReg, Size: 1, Mode: 0o755},
			{Name: "./a.txt", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, {Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
			[]got{{"run.sh", "x", true, false}, {"a.txt", "x", false, false}, {"l", "/etc/passwd", false, true}}, ""},
		{"beneath a link", []tar.Header{{Name: "./d", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "./d/passwd", Typeflag: tar.TypeReg, Size: 1}}, nil, "beneath a link"},
		{"a link and a directory of one name", []tar.Header{{Name: "./d/", Typeflag: tar.TypeDir}, {Name: "./d/x", Typeflag: tar.TypeReg, Size: 1},
			{Name: "./d", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, nil, "read tree"},
		{"target too long", []tar.Header{{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: strings.Repeat("a", 5000)}}, nil, "overlong"},
		{"targets count as bytes", []tar.Header{{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: strings.Repeat("a", 60)},
			{Name: "./m", Typeflag: tar.TypeSymlink, Linkname: strings.Repeat("b", 60)}}, nil, "more than 100 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var all []got
			_, err := readEntries(bytes.NewReader(tarOf(t, tc.entries...)), lim, func(e treeEntry) error {
				all = append(all, got{e.Name, string(e.Data), e.Exec, e.Link})
				return nil
			})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(all, tc.want) {
				t.Fatalf("read %v, %v; want %v", all, err, tc.want)
			}
		})
	}
}
