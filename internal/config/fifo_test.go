package config

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
)

// TestConfigFIFOIsRefused: a config path that is a FIFO is refused at once instead of
// blocking the open (which hung serve and doctor, and with them SIGTERM).
func TestConfigFIFOIsRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "klbr.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		citest.SkipOrFail(t, "mkfifo: "+err.Error())
	}
	env := map[string]string{EnvDataDir: dir, EnvConfig: fifo, EnvWorkspace: dir}
	done := make(chan error, 1)
	go func() {
		_, err := Load(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("Load with a FIFO config: %v, want a refusal naming it", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Load blocked on a FIFO config")
	}
}
