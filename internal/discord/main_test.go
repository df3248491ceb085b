package discord

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/discordtest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestMainReadsTheCredentialAndExitsOnABadToken(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	creds := t.TempDir()
	if err := os.WriteFile(filepath.Join(creds, "discord-token"), []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "klbr.toml")
	os.WriteFile(conf, []byte("[discord]\napi_base = \""+fake.APIBase()+"\"\n"), 0o600)
	env := map[string]string{"KLBR_DATA_DIR": c.dir, "KLBR_CONFIG": conf, "CREDENTIALS_DIRECTORY": creds, "KLBR_INGRESS_SOCKET": c.socket}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var out syncBuffer
	code := make(chan int, 1)
	go func() { code <- Main(context.Background(), nil, lookup, &out, nil) }()
	waitFor(t, "the gateway session", fake.Connected)
	if got := fake.Authorizations(); len(got) == 0 || got[0] != "Bot "+testToken {
		t.Fatalf("the REST calls did not carry the credential's token")
	}
	fake.CloseGateway(4004)
	select {
	case c := <-code:
		if c != 2 {
			t.Fatalf("exit code %d, want 2", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("klbr-discord kept going with a refused token")
	}
	if !strings.Contains(out.String(), "authentication failed") || strings.Contains(out.String(), testToken) {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestMainRefusesArgumentsAndAMissingToken(t *testing.T) {
	dir := t.TempDir()
	// A FIFO in place of the token: refused at once, never waited on.
	fifoDir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "discord-token"), 0o600); err != nil {
		citest.SkipOrFail(t, "mkfifo: "+err.Error())
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"arguments", []string{"--token", "x"}, nil, "takes no arguments"},
		{"no credential", nil, map[string]string{}, "no token"},
		{"empty credential", nil, map[string]string{"CREDENTIALS_DIRECTORY": dir}, "does not hold one bot token"},
		{"FIFO credential", nil, map[string]string{"CREDENTIALS_DIRECTORY": fifoDir}, "not a regular file"},
	}
	os.WriteFile(filepath.Join(dir, "discord-token"), []byte("\n"), 0o600)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"KLBR_DATA_DIR": t.TempDir()}
			for k, v := range tc.env {
				env[k] = v
			}
			var out bytes.Buffer
			code := Main(context.Background(), tc.args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, nil)
			if code != 1 || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("exit %d, output %q; want 1 and %q", code, out.String(), tc.want)
			}
			if strings.Contains(out.String(), "--token") {
				t.Fatalf("the arguments were echoed: %q", out.String())
			}
		})
	}
}

// SIGHUP rereads klbr.toml: its [discord] channel filter is sent to the
// transport; a file that does not load sends nothing (the filter stays).
func TestHangupRereadsTheFilter(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "klbr.toml")
	env := map[string]string{"KLBR_DATA_DIR": dir, "KLBR_CONFIG": conf, "HOME": dir}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal)
	out := make(chan Filter, 1)
	go reloadFilters(ctx, hup, lookup, config.Discord{}, out, slog.New(slog.DiscardHandler))

	os.WriteFile(conf, []byte("[discord]\nchannels = [\"123\", \"456\"]\ningest = \"directed\"\n"), 0o600)
	hup <- syscall.SIGHUP
	select {
	case f := <-out:
		if !slices.Equal(f.Channels, []string{"123", "456"}) || !f.Directed || f.IncludeBots {
			t.Fatalf("filter %+v", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no filter after SIGHUP")
	}
	os.WriteFile(conf, []byte("[discord\n"), 0o600)
	hup <- syscall.SIGHUP
	hup <- syscall.SIGHUP // taken only after the first was handled
	select {
	case f := <-out:
		t.Fatalf("a broken klbr.toml sent a filter %+v", f)
	default:
	}
}
