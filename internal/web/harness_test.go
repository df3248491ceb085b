package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

type fakeDaemon struct {
	st       *store.Store
	closing  chan struct{}
	mu       sync.Mutex
	shutdown []bool
}

func (d *fakeDaemon) Status(ctx context.Context) (api.Status, error) {
	ss, err := d.st.Sessions(ctx)
	out := api.Status{PID: os.Getpid(), Placement: "none", Workbench: "ready"}
	for _, s := range ss {
		out.Sessions = append(out.Sessions, api.SessionStatus{Session: s})
	}
	return out, err
}
func (d *fakeDaemon) Shutdown(stop bool) {
	d.mu.Lock()
	d.shutdown = append(d.shutdown, stop)
	d.mu.Unlock()
}
func (d *fakeDaemon) Closing() <-chan struct{} { return d.closing }
func (d *fakeDaemon) Draining() bool           { return false }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

type harness struct {
	st       *store.Store
	admit    *admission.Admitter
	sessions *session.Manager
	daemon   *fakeDaemon
	srv      *Server
	http     *httptest.Server
	logs     *syncBuffer
	deltas   *live.Hub
	dir      string // the data directory: the store is dir/runtime.sqlite
}

func start(t testing.TB) *harness { t.Helper(); return startWith(t, nil) }

// startWith is start with the optional parts of Browser set by with (it may
// use the harness's store, admitter and sessions).
func startWith(t testing.TB, with func(h *harness, b *Browser)) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{logs: &syncBuffer{}, deltas: live.NewHub(), dir: dir}
	var err error
	h.st, err = store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.st.Close() })
	if err := h.st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	h.sessions = session.NewManager(h.st)
	h.admit = admission.New(h.st, h.sessions, nil, nil)
	h.daemon = &fakeDaemon{st: h.st, closing: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(h.logs, nil))
	b := Browser{Store: h.st, Admit: h.admit, Sessions: h.sessions, Daemon: h.daemon, Token: testToken, Deltas: h.deltas}
	if with != nil {
		with(h, &b)
	}
	h.srv, err = New(h.daemon, promhttp.Handler(), log).WithBrowser(b)
	if err != nil {
		t.Fatal(err)
	}
	// Served as klbr-core serves its TCP port: the server's limits and the gate that keeps
	// places for the operator (HTTPServer, Listener).
	h.http = httptest.NewUnstartedServer(nil)
	h.http.Config = h.srv.HTTPServer()
	h.http.Listener = h.srv.Listener(h.http.Listener)
	h.http.Start()
	t.Cleanup(h.http.Close)
	return h
}

func (h *harness) wsURL() string { return "ws" + strings.TrimPrefix(h.http.URL, "http") + "/v2/ws" }

// dial opens /v2/ws with the token cookie and extra headers.
func (h *harness) dial(t testing.TB, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	if hdr == nil {
		hdr = http.Header{}
	}
	if hdr.Get("Cookie") == "" {
		hdr.Set("Cookie", CookieName+"="+testToken)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: hdr})
}

// hello dials and sends hello with cursor.
func (h *harness) hello(t testing.TB, cursor int64) *websocket.Conn {
	t.Helper()
	c, _, err := h.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h.sayHello(t, c, cursor)
}

// helloSmallBuffer is hello over a connection whose receive buffer is fixed
// small (no autotuning; on this machine loopback buffers grow to 32 MiB), so
// a client that does not read fills it quickly.
func (h *harness) helloSmallBuffer(t testing.TB, cursor int64) *websocket.Conn {
	t.Helper()
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		return serr
	}}
	hc := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hdr := http.Header{}
	hdr.Set("Cookie", CookieName+"="+testToken)
	c, _, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	return h.sayHello(t, c, cursor)
}

func (h *harness) sayHello(t testing.TB, c *websocket.Conn, cursor int64) *websocket.Conn {
	t.Helper()
	c.SetReadLimit(8 << 20)
	t.Cleanup(func() { c.CloseNow() })
	writeJSON(t, c, map[string]any{"type": "hello", "session": "default", "cursor": cursor})
	return c
}

func writeJSON(t testing.TB, c *websocket.Conn, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// serverMsg is any server message.
type serverMsg struct {
	Type       string         `json:"type"`
	Records    []store.Record `json:"records"`
	More       bool           `json:"more"`
	Key        string         `json:"key"`
	ID         int64          `json:"id"`
	EventID    int64          `json:"event_id"`
	Duplicate  bool           `json:"duplicate"`
	Unanswered string         `json:"unanswered"`
	Code       string         `json:"code"`
	Message    string         `json:"message"`
	Action     string         `json:"action"`
	Deltas     []deltaItem    `json:"deltas"`
}

func readMsg(t *testing.T, c *websocket.Conn, d time.Duration) serverMsg {
	t.Helper()
	m, err := tryRead(c, d)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tryRead(c *websocket.Conn, d time.Duration) (serverMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var m serverMsg
	_, b, err := c.Read(ctx)
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// admitN admits n operator inputs in one commit and returns their texts.
func (h *harness) admitN(t testing.TB, n int, prefix string, body int) {
	t.Helper()
	// Random text: compression must not shrink what a slow client is sent.
	raw := make([]byte, body*3/4+3)
	rand.Read(raw)
	pad := base64.StdEncoding.EncodeToString(raw)[:body]
	now := time.Now()
	err := h.st.Write(context.Background(), func(tx *store.Tx) error {
		for i := range n {
			_, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator",
				SourceKey: prefix + "-" + itoa(i), Conversation: "operator", Author: "operator",
				OccurredAt: now, ReceivedAt: now, Body: prefix + "-" + itoa(i) + pad})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
