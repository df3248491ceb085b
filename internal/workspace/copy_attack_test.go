package workspace

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/uidtest"
)

// secretOutside is a file outside every tree the tests copy, holding a
// random value the copies must never hold.
func secretOutside(t *testing.T) (dir, file string, value []byte) {
	t.Helper()
	dir = t.TempDir()
	var b [16]byte
	rand.Read(b[:])
	value = []byte("secret-" + hex.EncodeToString(b[:]))
	file = filepath.Join(dir, "operator-token")
	if err := os.WriteFile(file, value, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file, value
}

// leaks walks the copy at top without following anything and says where
// it holds secret or a link that leads out of top.
func leaks(t *testing.T, top string, secret []byte) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			to := filepath.Join(filepath.Dir(p), target)
			if filepath.IsAbs(target) || !within(to, top) {
				found = append(found, fmt.Sprintf("%s is a link out of the copy", p))
			}
		case t.IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if bytes.Contains(b, secret) {
				found = append(found, fmt.Sprintf("%s holds the secret", p))
			}
		case !t.IsDir():
			found = append(found, fmt.Sprintf("%s is a %v", p, t))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// swapWhenOpened watches dir with inotify and, the moment the copy opens
// its subdirectory sub, replaces sub/zz.txt by a link to secretFile and
// sub/zz-dir by a link to secretDir: between the copy's listing and its
// opening of each entry. The swap acts on files as uid as (-1: as this
// process). It returns a func that waits for the swap (or says it never
// came) and stops the watch.
func swapWhenOpened(t *testing.T, dir, secretFile, secretDir string, as int) func() bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		unix.Close(fd)
		t.Fatalf("inotify watch: %v", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	swapped := make(chan bool, 1)
	go func() {
		if as >= 0 {
			if err := uidtest.AsFS(as, as); err != nil {
				swapped <- false
				return
			}
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				swapped <- false
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				// struct inotify_event: wd, mask, cookie, len, name[len].
				mask := binary.NativeEndian.Uint32(buf[off+4:])
				size := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+size]), "\x00")
				off += unix.SizeofInotifyEvent + size
				if mask&unix.IN_ISDIR != 0 && name == "sub" {
					sub := filepath.Join(dir, "sub")
					os.Remove(filepath.Join(sub, "zz.txt"))
					os.Symlink(secretFile, filepath.Join(sub, "zz.txt"))
					os.RemoveAll(filepath.Join(sub, "zz-dir"))
					os.Symlink(secretDir, filepath.Join(sub, "zz-dir"))
					swapped <- true
					return
				}
			}
		}
	}()
	return func() bool {
		select {
		case ok := <-swapped:
			f.Close()
			return ok
		case <-time.After(5 * time.Second):
			f.Close()
			return <-swapped
		}
	}
}

// The attack of issue 27: a cell swaps a file of its workspace for a
// link to the operator token while klbr-core copies the workspace for a
// child (timed with inotify: the swap lands between the copy's listing
// of the directory and its opening of the file). 20 runs; the secret is
// never in the copy, nor a link to it.
func TestCopyRaceSwapsAFileForALink(t *testing.T) {
	requireGit(t)
	secretDir, secretFile, secret := secretOutside(t)
	swaps, leaked := 0, 0
	for range 20 {
		root := t.TempDir()
		fillRaceTree(t, root)
		wait := swapWhenOpened(t, root, secretFile, secretDir, -1)
		ok := copyLeaksNothing(t, root, filepath.Join(t.TempDir(), "worktrees"), secret)
		if wait() {
			swaps++
		}
		if !ok {
			leaked++
		}
	}
	if leaked > 0 {
		t.Errorf("%d of 20 copies leaked", leaked)
	}
	if swaps == 0 {
		t.Fatal("the swap never happened: the test proves nothing")
	}
	t.Logf("%d of 20 runs swapped during the copy", swaps)
}

// fillRaceTree fills a workspace for the swap: sub/ with 300 files listed
// before zz.txt and zz-dir/.
func fillRaceTree(t *testing.T, root string) {
	t.Helper()
	sub := filepath.Join(root, "sub")
	os.Mkdir(sub, 0o755)
	for i := range 300 {
		write(t, filepath.Join(sub, fmt.Sprintf("f%03d.txt", i)), "filler\n")
	}
	write(t, filepath.Join(sub, "zz.txt"), "harmless\n")
	os.Mkdir(filepath.Join(sub, "zz-dir"), 0o755)
	write(t, filepath.Join(sub, "zz-dir", "operator-token"), "harmless\n")
}

// copyLeaksNothing copies the workspace at root for a child into
// worktrees and says whether the copy is safe: refused and gone, or made
// without secret and without a link out. Each leak is reported on t.
func copyLeaksNothing(t *testing.T, root, worktrees string, secret []byte) bool {
	t.Helper()
	w := &Workspaces{Root: root, Dir: worktrees}
	p, err := w.Make(t.Context(), w.Shared(), "race")
	if err != nil {
		// Refusing is safe; the copy must then be gone.
		if ents, _ := os.ReadDir(w.Dir); len(ents) != 0 {
			t.Fatalf("%s: a failed copy left %v", root, ents)
		}
		return true
	}
	if found := leaks(t, p.Dir, secret); len(found) > 0 {
		t.Errorf("%s: %s", root, strings.Join(found, "; "))
		return false
	}
	return true
}

// A regular file swapped for a FIFO after the listing must not hang the
// copy (opening a FIFO for reading blocks until a writer comes).
func TestCopyRaceSwapsAFileForAFIFO(t *testing.T) {
	requireGit(t)
	root := t.TempDir()
	sub := filepath.Join(root, "sub")
	os.Mkdir(sub, 0o755)
	for i := range 300 {
		write(t, filepath.Join(sub, fmt.Sprintf("f%03d.txt", i)), "filler\n")
	}
	write(t, filepath.Join(sub, "zz.txt"), "harmless\n")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	unix.InotifyAddWatch(fd, root, unix.IN_OPEN)
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
			zz := filepath.Join(sub, "zz.txt")
			os.Remove(zz)
			unix.Mkfifo(zz, 0o644)
			return
		}
	}()
	w := &Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees")}
	done := make(chan error, 1)
	go func() {
		_, err := w.Make(t.Context(), w.Shared(), "fifo")
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		// Release the copy (a writer opens the FIFO) before failing.
		if wf, err := os.OpenFile(filepath.Join(sub, "zz.txt"), os.O_WRONLY, 0); err == nil {
			wf.Close()
		}
		<-done
		t.Fatal("the copy blocked opening a FIFO swapped in after the listing")
	}
}

// What a workspace may hold that must not be followed or opened: links
// out of it (to a file, to a directory, absolute), a hard link to a file
// outside, a FIFO, a socket, a device.
func TestCopyRefusesWhatLeadsOutside(t *testing.T) {
	requireGit(t)
	secretDir, secretFile, secret := secretOutside(t)
	for _, c := range outsideCases(secretDir, secretFile) {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, filepath.Join(root, "notes.txt"), "root\n")
			os.Symlink("notes.txt", filepath.Join(root, "inside"))
			if err := c.make(t, root); err != nil {
				if errors.Is(err, syscall.EPERM) {
					t.Skipf("cannot make it here: %v", err)
				}
				t.Fatal(err)
			}
			checkOutsideCopy(t, root, filepath.Join(t.TempDir(), "worktrees"), c.fails, secret)
		})
	}
}

// outsideCase is one thing a workspace may hold that leads outside it.
type outsideCase struct {
	name  string
	make  func(t *testing.T, root string) error
	fails bool // the copy is refused as a whole
}

func outsideCases(secretDir, secretFile string) []outsideCase {
	return []outsideCase{
		{"link to a file outside", func(t *testing.T, root string) error {
			return os.Symlink(secretFile, filepath.Join(root, "token"))
		}, false},
		{"relative link out", func(t *testing.T, root string) error {
			rel, _ := filepath.Rel(root, secretFile)
			return os.Symlink(rel, filepath.Join(root, "token"))
		}, false},
		{"link to a directory outside", func(t *testing.T, root string) error {
			return os.Symlink(secretDir, filepath.Join(root, "data"))
		}, false},
		{"link out from a subdirectory", func(t *testing.T, root string) error {
			os.Mkdir(filepath.Join(root, "a"), 0o755)
			return os.Symlink("../../../../../../../../.."+secretFile, filepath.Join(root, "a", "t"))
		}, false},
		{"hard link to a file outside", func(t *testing.T, root string) error {
			return os.Link(secretFile, filepath.Join(root, "token"))
		}, true},
		{"fifo", func(t *testing.T, root string) error {
			return unix.Mkfifo(filepath.Join(root, "pipe"), 0o644)
		}, false},
		{"socket", func(t *testing.T, root string) error {
			l, err := net.Listen("unix", filepath.Join(root, "sock"))
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return err
		}, false},
		{"device", func(t *testing.T, root string) error {
			// /dev/zero's numbers: reading it never ends.
			return unix.Mknod(filepath.Join(root, "zero"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5)))
		}, false},
	}
}

// checkOutsideCopy copies the workspace at root (notes.txt, a link inside
// to it, and what a case added) into worktrees: refused if fails, else
// copied with nothing from outside.
func checkOutsideCopy(t *testing.T, root, worktrees string, fails bool, secret []byte) {
	t.Helper()
	w := &Workspaces{Root: root, Dir: worktrees}
	done := make(chan struct{})
	var p Place
	var err error
	go func() { p, err = w.Make(t.Context(), w.Shared(), "static"); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the copy blocked")
	}
	if fails {
		if err == nil {
			t.Fatalf("copied; want refused (leaks: %v)", leaks(t, p.Dir, secret))
		}
		if !strings.Contains(err.Error(), "hard link") {
			t.Fatalf("error %q does not say why", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if found := leaks(t, p.Dir, secret); len(found) > 0 {
		t.Fatal(strings.Join(found, "; "))
	}
	if read(t, filepath.Join(p.Dir, "notes.txt")) != "root\n" {
		t.Fatal("notes.txt not copied")
	}
	if l, err := os.Readlink(filepath.Join(p.Dir, "inside")); err != nil || l != "notes.txt" {
		t.Fatalf("the link inside the tree: %q %v", l, err)
	}
}

// Removing a child's copy never follows a link the child left in it,
// nor one it swaps in while the removal runs (timed with inotify: sub is
// swapped for a link to a directory outside when the removal opens it).
// os.RemoveAll walks by descriptor with O_NOFOLLOW; this keeps it so.
func TestRemoveFollowsNoLink(t *testing.T) {
	requireGit(t)
	for run := range 5 {
		outside := t.TempDir()
		write(t, filepath.Join(outside, "keep"), "keep\n")
		root := t.TempDir()
		sub := filepath.Join(root, "sub")
		os.Mkdir(sub, 0o755)
		for i := range 200 {
			write(t, filepath.Join(sub, fmt.Sprintf("f%03d.txt", i)), "filler\n")
		}
		w := &Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees")}
		p, err := w.Make(t.Context(), w.Shared(), "remove")
		if err != nil {
			t.Fatal(err)
		}
		// What the child leaves: a link out, to a file and to a directory.
		os.Symlink(outside, filepath.Join(p.Dir, "out"))
		os.Symlink(filepath.Join(outside, "keep"), filepath.Join(p.Dir, "keep"))
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		unix.InotifyAddWatch(fd, p.Dir, unix.IN_OPEN)
		f := os.NewFile(uintptr(fd), "inotify")
		go func() {
			buf := make([]byte, 64<<10)
			if _, err := f.Read(buf); err != nil {
				return
			}
			os.Rename(filepath.Join(p.Dir, "sub"), filepath.Join(p.Dir, "sub-moved"))
			os.Symlink(outside, filepath.Join(p.Dir, "sub"))
		}()
		err = w.Remove(t.Context(), p)
		f.Close()
		if b, rerr := os.ReadFile(filepath.Join(outside, "keep")); rerr != nil || string(b) != "keep\n" {
			t.Fatalf("run %d: the removal reached outside the copy: %v (remove: %v)", run, rerr, err)
		}
		if err == nil {
			if _, err := os.Lstat(p.Dir); err == nil {
				t.Fatalf("run %d: removed, yet %s is there", run, p.Dir)
			}
		}
	}
}
