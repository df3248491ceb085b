package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
)

func TestReadRegular(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte("sk-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := Read(p, 64)
	if err != nil || string(b) != "sk-test\n" {
		t.Fatalf("Read = %q, %v", b, err)
	}
}

func TestReadRefusesLarge(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, make([]byte, 65), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p, 64); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read of 65 bytes with max 64: %v, want ErrTooLarge", err)
	}
}

func TestReadRefusesDirectoryAndMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir, 64); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Read(dir) = %v, want ErrNotRegular", err)
	}
	if _, err := Read(filepath.Join(dir, "absent"), 64); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read(absent) = %v, want ErrNotExist", err)
	}
}

// A FIFO with no writer must be refused at once; a blocking open would wait
// for a writer for ever.
func TestReadRefusesFIFOWithoutBlocking(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		citest.SkipOrFail(t, "mkfifo: "+err.Error())
	}
	done := make(chan error, 1)
	go func() { _, err := Read(p, 64); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Fatalf("Read(fifo) = %v, want ErrNotRegular", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read(fifo) blocked")
	}
}
