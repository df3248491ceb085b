package discord

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// slowHello stands between the transport and klbr-core's ingress.sock and
// holds the transport's hello until release is closed: the start in which
// live messages are admitted before the hello's backfill runs.
func slowHello(t *testing.T, socket string, release <-chan struct{}) string {
	t.Helper()
	proxy := filepath.Join(t.TempDir(), "slow.sock")
	l, err := unixsock.Listen(proxy, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: "ingress"})
	rp.ErrorLog = log.New(io.Discard, "", 0) // the cleanup cancels a claim in flight
	rp.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/transport/hello" {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return proxy
}

// A message the flood limiter refused stays refused when a backfill reads
// it back from history (the start's, when live messages were admitted
// before the hello; a deaf connection's; a thread's read-back): it is
// counted and named by the burst's notice already, and admitting it would
// let a flood past the limit a page at a time.
func TestABackfillDoesNotAdmitWhatTheLimiterRefused(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	const burst = 20
	runTransportWith(t, fake, slowHello(t, c.socket, release), func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{AuthorBurst: burst, AuthorPerMinute: 1, ChannelBurst: 1000, ChannelPerMinute: 1000, Quiet: 400 * time.Millisecond}
		cfg.Operator = "8"
	})
	for i := range 60 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(22001+i), "50", "7", "5", fmt.Sprint("spam ", i)))
	}
	waitFor(t, "the burst admitted", func() bool { return count(pending(t, c), "discord:50") == burst })
	time.Sleep(200 * time.Millisecond) // the rest decided (refused) meanwhile
	close(release)
	released = true
	waitFor(t, "the hello's backfill of channel 50", func() bool { return fake.Requests("GET /api/v9/channels/50/messages") > 0 })
	time.Sleep(300 * time.Millisecond)
	// Something after the backfill, in the same queue.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("22100", "51", "7", "8", "the operator, after"))
	waitFor(t, "the operator's message", func() bool { return count(pending(t, c), "discord:51") == 1 })
	if n := count(pending(t, c), "discord:50"); n != burst {
		t.Fatalf("%d of the flood admitted, want the burst (%d): the backfill admitted what the limiter refused", n, burst)
	}
	waitFor(t, "the burst's notice", func() bool { return count(pending(t, c), "discord:gateway") == 1 })
	if notice := inputContents(t, c, "discord:gateway"); len(notice) != 1 || !containsAll(notice[0], "rate-limited: 40 messages in channel 50", "22060") {
		t.Fatalf("notice %q: want the 40 refused, named", notice)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
