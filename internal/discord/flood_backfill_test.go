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
// holds the transport's hello until release is closed: a start in which live
// messages arrive (and the flood limiter decides them) before the hello.
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
// it back from history (a restart's, when live messages were decided before
// the hello; a deaf connection's; a thread's read-back): it is counted and
// named by the burst's notice already, and admitting it would let a flood
// past the limit a page at a time.
func TestABackfillDoesNotAdmitWhatTheLimiterRefused(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	const burst = 20
	limits := func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{AuthorBurst: burst, AuthorPerMinute: 1, ChannelBurst: 1000, ChannelPerMinute: 1000, Quiet: 400 * time.Millisecond}
		cfg.Operator = "8"
	}
	// A first klbr-discord: klbr-core learns channel 50, its cursor at 22000.
	stop := runTransportStoppable(t, fake, c.socket, limits)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("22000", "50", "7", "6", "before the restart"))
	waitFor(t, "the first message", func() bool { return count(pending(t, c), "discord:50") == 1 })
	stop()
	// The next one hears a flood before its hello: the limiter decides it
	// as it arrives, then the hello's backfill reads it all back.
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	logs, _ := runTransportWith(t, fake, slowHello(t, c.socket, release), limits)
	for i := range 60 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(22001+i), "50", "7", "5", fmt.Sprint("spam ", i)))
	}
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("22090", "52", "7", "8", "the operator, after the flood"))
	// The burst ends (its quiet time over) once the flood was decided.
	waitFor(t, "the burst's end", func() bool { return strings.Contains(logs.String(), "a flood was rate-limited") })
	close(release)
	released = true
	waitFor(t, "the operator's message", func() bool { return count(pending(t, c), "discord:52") == 1 })
	waitFor(t, "the hello's backfill of channel 50", func() bool { return fake.Requests("GET /api/v9/channels/50/messages") > 0 })
	time.Sleep(300 * time.Millisecond)
	// Something after the backfill, in the same queue.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("22100", "51", "7", "8", "the operator, after"))
	waitFor(t, "the operator's message", func() bool { return count(pending(t, c), "discord:51") == 1 })
	if n := count(pending(t, c), "discord:50"); n != 1+burst {
		t.Fatalf("%d of the flood admitted, want the burst (%d): the backfill admitted what the limiter refused", n-1, burst)
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
