package placement

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

func TestDetectReportsEachFallback(t *testing.T) {
	ctx := testCtx(t)
	var logs bytes.Buffer
	bus := "unix:path=" + filepath.Join(t.TempDir(), "no-bus")
	p, err := Detect(ctx, Options{SystemdBus: bus, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t.Logf("mode %s; skipped %v", p.Mode(), p.Skipped())
	skipped := p.Skipped()
	if len(skipped) == 0 || skipped[0].Mode != ModeSystemdScope || !strings.Contains(skipped[0].Reason.Error(), "no-bus") {
		t.Fatalf("skipped = %v, want systemd-scope first, naming the bus", skipped)
	}
	if !strings.Contains(logs.String(), "mode=systemd-scope") || !strings.Contains(logs.String(), "placement mode not available") {
		t.Errorf("the fallback was not logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "msg=\"placement mode\" component=placement mode="+string(p.Mode())) {
		t.Errorf("the chosen mode was not logged:\n%s", logs.String())
	}
	switch p.Mode() {
	case ModeCgroup:
		if len(skipped) != 1 {
			t.Errorf("skipped = %v", skipped)
		}
	case ModeRlimit:
		if len(skipped) != 2 || skipped[1].Mode != ModeCgroup {
			t.Errorf("skipped = %v", skipped)
		}
	default:
		t.Fatalf("mode %s", p.Mode())
	}
}

func TestDetectOnly(t *testing.T) {
	ctx := testCtx(t)
	p, err := Detect(ctx, Options{Only: []Mode{ModeRlimit}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Mode() != ModeRlimit || len(p.Skipped()) != 2 {
		t.Fatalf("mode %s, skipped %v", p.Mode(), p.Skipped())
	}
	if _, err := Detect(ctx, Options{Only: []Mode{"bogus"}}); err == nil {
		t.Fatal("no mode allowed must be an error")
	}
}
