package localapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/httpguard"
)

// TestHalfCloseGetsTheCommitOrAnError: a client that sends a complete request and then
// half-closes its socket gets the committed input's id (never an empty 200), and the input
// is stored exactly once.
func TestHalfCloseGetsTheCommitOrAnError(t *testing.T) {
	h := start(t)
	before := h.counts(t)["inputs"]
	for i := range 3 {
		body := fmt.Sprintf(`{"text":"half-closed %d","source_key":"hc-%d"}`, i, i)
		conn, err := net.Dial("unix", h.sock)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/sessions/default/inputs HTTP/1.1\r\nHost: klbr\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		conn.(*net.UnixConn).CloseWrite()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("try %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		var got api.SendResponse
		if resp.StatusCode == http.StatusCreated {
			if err := json.Unmarshal(b, &got); err != nil || got.ID == 0 {
				t.Fatalf("try %d: 201 without an id: %q", i, b)
			}
			continue
		}
		if resp.StatusCode < 400 {
			t.Fatalf("try %d: success status %d without a commit: %q", i, resp.StatusCode, b)
		}
	}
	if got := h.counts(t)["inputs"] - before; got != 3 {
		t.Fatalf("%d inputs stored, want 3 (each answered with its id)", got)
	}
}

// TestSlowBodyIsCut: a request whose body trickles in is cut at the body timeout instead of
// holding its connection (the finding: over a minute).
func TestSlowBodyIsCut(t *testing.T) {
	h := startWith(t, httpguard.Limits{Body: 300 * time.Millisecond})
	conn, err := net.Dial("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/sessions/default/inputs HTTP/1.1\r\nHost: klbr\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":")
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode < 400 {
			t.Fatalf("slow body answered %d %q", resp.StatusCode, b)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the slow body held its connection %s", took)
	}
	// The connection is closed (a read sees EOF or a reset, not a hang).
	var one [1]byte
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err := conn.Read(one[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the server kept the slow connection open")
			}
			break
		}
	}
}

// TestIdleConnectionsAreBoundedAndClosed: idle connections past the bound wait in the
// backlog instead of costing descriptors, and an idle one is closed at the header timeout.
func TestIdleConnectionsAreClosed(t *testing.T) {
	h := startWith(t, httpguard.Limits{Header: 300 * time.Millisecond})
	conn, err := net.Dial("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GET /v1/status HTTP/1.1\r\n")) // never finishes its headers
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection that never finished its headers was kept open")
	}
	if len(b) > 0 && !strings.HasPrefix(string(b), "HTTP/1.1 408") && !strings.HasPrefix(string(b), "HTTP/1.1 400") {
		t.Logf("answer: %q", b)
	}
}

// TestFollowerThatDoesNotReadIsCut: a tail --follow that stops reading is cut once a page
// has waited FollowLag, instead of holding its connection and its records forever.
func TestFollowerThatDoesNotReadIsCut(t *testing.T) {
	h := startWith(t, httpguard.Limits{})
	// Not start's server: this one with a short lag. Replace the harness's handler by a
	// second server on its own socket.
	ctl := New(h.st, h.admit, h.sessions, h.daemon, slogDiscard())
	ctl.FollowLag = 300 * time.Millisecond
	sock := h.sock + ".follow"
	srv := ctl.HTTPServer()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	big := strings.Repeat("x", 60<<10)
	for i := range 200 {
		if _, err := h.client.Send(t.Context(), "default", sendBig(big, i)); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.UnixConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET /v1/sessions/default/records?follow=1 HTTP/1.1\r\nHost: klbr\r\n\r\n")
	time.Sleep(2 * time.Second) // not reading, far past the lag
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the follower that did not read was not cut (read %d bytes, then the stream went on)", n)
	}
	if n >= int64(200*len(big)) {
		t.Fatalf("the cut follower still got every record (%d bytes)", n)
	}
}

func sendBig(text string, i int) api.SendRequest {
	return api.SendRequest{Text: text, SourceKey: fmt.Sprintf("big-%d", i)}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
