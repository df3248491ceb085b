package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// A core whose disk is full answers the transport's admissions with a
// retryable 503 that says why (never a 500, never a per-message refusal that
// the transport would drop), and admits them once space is freed.
func TestAdmitWhileTheDiskIsFull(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", 8<<20)); err != nil {
		citest.SkipOrFail(t, fmt.Sprintf("cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): %v", err))
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	c := startCore(t, dir)
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	big := strings.Repeat("x", 30000)
	var refused *ingressapi.StatusError
	for i := range 400 {
		_, err := c.client.Admit(context.Background(), ingressapi.AdmitRequest{Messages: []ingressapi.Message{
			msg(fmt.Sprint(5000+i), "10", ingressapi.ModeAmbient, big)}})
		if err != nil {
			if !errors.As(err, &refused) {
				t.Fatalf("admit on a full disk: %v", err)
			}
			break
		}
	}
	if refused == nil {
		t.Fatal("400 admissions of 30 KB to a full disk all succeeded")
	}
	if refused.Status != http.StatusServiceUnavailable || refused.Permanent() || !strings.Contains(refused.Message, "disk is full") {
		t.Fatalf("admit on a full disk: %v (want a retryable 503 that says the disk is full)", refused)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	resp, err := c.client.Admit(context.Background(), ingressapi.AdmitRequest{Messages: []ingressapi.Message{msg("6000", "10", ingressapi.ModeAmbient, "after")}})
	if err != nil || resp.Results[0].Error != nil {
		t.Fatalf("admit after the disk was freed: %+v %v", resp, err)
	}
}
