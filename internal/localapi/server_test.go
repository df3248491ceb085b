package localapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/httpguard"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// The test binary doubles as a client run under another uid.
func TestMain(m *testing.M) {
	if sock := os.Getenv("KLBR_LOCALAPI_CHILD_SOCKET"); sock != "" {
		c := localclient.New(sock)
		_, err := c.Status(context.Background())
		var e *localclient.Error
		switch {
		case errors.As(err, &e):
			fmt.Printf("status %d %s\n", e.Status, e.Code)
		case err != nil:
			fmt.Printf("error %v\n", err)
		default:
			fmt.Println("ok")
		}
		return
	}
	os.Exit(m.Run())
}

type fakeDaemon struct {
	st       *store.Store
	closing  chan struct{}
	mu       sync.Mutex
	shutdown []bool
}

func (d *fakeDaemon) Status(ctx context.Context) (api.Status, error) {
	ss, err := d.st.Sessions(ctx)
	out := api.Status{PID: os.Getpid()}
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

type harness struct {
	dir      string
	sock     string
	st       *store.Store
	admit    *admission.Admitter
	sessions *session.Manager
	daemon   *fakeDaemon
	client   *localclient.Client
	logs     *syncBuffer
}

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

func start(t *testing.T) *harness { t.Helper(); return startWith(t, httpguard.Limits{}) }

func startWith(t *testing.T, limits httpguard.Limits, with ...func(*Server)) *harness {
	t.Helper()
	dir, err := os.MkdirTemp("", "klbr-api-") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &harness{dir: dir, sock: filepath.Join(dir, "control.sock"), logs: &syncBuffer{}}
	h.st, err = store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	h.sessions = session.NewManager(h.st)
	h.admit = admission.New(h.st, h.sessions, nil, nil)
	h.daemon = &fakeDaemon{st: h.st, closing: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(h.logs, nil))
	api := New(h.st, h.admit, h.sessions, h.daemon, log)
	api.Limits = limits
	for _, f := range with {
		f(api)
	}
	srv := api.HTTPServer()
	l, err := unixsock.Listen(h.sock, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	h.client = localclient.New(h.sock)
	t.Cleanup(func() {
		close(h.daemon.closing)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		h.client.Close()
		h.st.Close()
	})
	return h
}

// counts is every table's row count: a refused request must leave it as it was.
func (h *harness) counts(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"events", "session_items", "inputs", "inbox", "attention_frames", "sessions"} {
		db, err := sqlOpenRO(h.dir)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.Close()
		out[table] = n
	}
	return out
}

func TestSendAndRead(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	res, err := h.client.Send(ctx, "default", api.SendRequest{Text: "hello", SourceKey: "k1"})
	if err != nil || res.Duplicate || res.ID == 0 {
		t.Fatalf("send: %+v %v", res, err)
	}
	again, err := h.client.Send(ctx, "default", api.SendRequest{Text: "hello", SourceKey: "k1"})
	if err != nil || !again.Duplicate || again.ID != res.ID {
		t.Fatalf("resend: %+v %v", again, err)
	}
	recs, err := h.client.Records(ctx, "default", 0, 0)
	if err != nil || len(recs.Records) != 1 || recs.More {
		t.Fatalf("records: %+v %v", recs, err)
	}
	st, err := h.client.Session(ctx, "default")
	if err != nil || st.ID != "default" {
		t.Fatalf("session: %+v %v", st, err)
	}
}

func TestBadRequestsAreRefusedAndWriteNothing(t *testing.T) {
	h := start(t)
	big := `{"text":"` + strings.Repeat("x", api.MaxRequestBytes) + `","source_key":"k"}`
	tooLongText := `{"text":"` + strings.Repeat("x", admission.MaxBodyBytes+1) + `","source_key":"k"}`
	for _, tc := range []struct {
		name   string
		path   string
		body   string
		status int
		code   string
	}{
		{"oversized body", "/v1/sessions/default/inputs", big, 413, api.CodeTooLarge},
		{"text over the input bound", "/v1/sessions/default/inputs", tooLongText, 400, api.CodeInvalid},
		{"invalid UTF-8", "/v1/sessions/default/inputs", "{\"text\":\"a\xff\",\"source_key\":\"k\"}", 400, api.CodeInvalid},
		{"unknown session", "/v1/sessions/nope/inputs", `{"text":"a","source_key":"k"}`, 404, api.CodeNotFound},
		{"malformed session id", "/v1/sessions/..%2Fx/inputs", `{"text":"a","source_key":"k"}`, 400, api.CodeInvalid},
		{"source kind smuggled in", "/v1/sessions/default/inputs", `{"text":"a","source_key":"k","source_kind":"discord"}`, 400, api.CodeInvalid},
		{"malformed JSON", "/v1/sessions/default/inputs", `{"text":"a",`, 400, api.CodeInvalid},
		{"not an object", "/v1/sessions/default/inputs", `["a"]`, 400, api.CodeInvalid},
		{"trailing data", "/v1/sessions/default/inputs", `{"text":"a","source_key":"k"} {}`, 400, api.CodeInvalid},
		{"empty body", "/v1/sessions/default/inputs", ``, 400, api.CodeInvalid},
		{"empty text", "/v1/sessions/default/inputs", `{"text":"","source_key":"k"}`, 400, api.CodeInvalid},
		{"missing key", "/v1/sessions/default/inputs", `{"text":"a"}`, 400, api.CodeInvalid},
		{"NUL in text", "/v1/sessions/default/inputs", `{"text":"a\u0000b","source_key":"k"}`, 400, api.CodeInvalid},
		{"unknown endpoint", "/v1/nothing", `{}`, 404, api.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.counts(t)
			status, body := rawRequest(t, h.sock, "POST", tc.path, tc.body, len(tc.body))
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			var e api.Error
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Fatalf("error body %q: want code %s with a message", body, tc.code)
			}
			if after := h.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("tables changed: %v → %v", before, after)
			}
		})
	}
}

func TestTruncatedRequestWritesNothing(t *testing.T) {
	h := start(t)
	before := h.counts(t)
	body := `{"text":"hello","source_key":"trunc"}`
	conn, err := net.Dial("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Promise more bytes than we send, then close our side.
	fmt.Fprintf(conn, "POST /v1/sessions/default/inputs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body)+20, body)
	conn.(*net.UnixConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a truncated request: %v", err)
	}
	if resp.StatusCode != 400 {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	if after := h.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("tables changed: %v → %v", before, after)
	}
}

// rawRequest sends a request with a chosen Content-Length over the socket.
func rawRequest(t *testing.T, sock, method, path, body string, length int) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(method, "http://klbr"+path, strings.NewReader(body))
	req.ContentLength = int64(length)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestPeerUnderAnotherUIDIsRefused(t *testing.T) {
	if os.Getuid() != 0 {
		citest.SkipOrFail(t, "needs root to run a client under another uid")
	}
	h := start(t)
	// Copy the test binary where uid 65534 can run it.
	bin := filepath.Join(h.dir, "client.test")
	copyFile(t, os.Args[0], bin, 0o755)
	os.Chmod(h.dir, 0o755)

	run := func() string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = []string{"KLBR_LOCALAPI_CHILD_SOCKET=" + h.sock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// With the socket's mode 0600 the kernel refuses the connection itself.
	if out := run(); !strings.Contains(out, "permission denied") {
		t.Fatalf("uid 65534 on a 0600 socket: %q", out)
	}
	// Even if the socket were opened up, the peer check refuses with 403 and a log line.
	os.Chmod(h.sock, 0o666)
	if out := run(); out != "status 403 forbidden" {
		t.Fatalf("uid 65534 on an open socket: %q", out)
	}
	if !strings.Contains(h.logs.String(), "refused peer") || !strings.Contains(h.logs.String(), "peer_uid=65534") {
		t.Fatalf("no log line for the refused peer: %s", h.logs.String())
	}
	// The daemon's own user (root here) is served.
	if _, err := h.client.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestFollowStreamsNewRecordsOnce(t *testing.T) {
	h := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, _ := h.client.Send(ctx, "default", api.SendRequest{Text: "one", SourceKey: "1"})
	_ = first
	got := make(chan store.Record, 10)
	done := make(chan error, 1)
	go func() {
		done <- h.client.Follow(ctx, "default", 0, func(r store.Record) error { got <- r; return nil })
	}()
	r1 := <-got
	for _, k := range []string{"2", "3"} {
		if _, err := h.client.Send(ctx, "default", api.SendRequest{Text: "more", SourceKey: k}); err != nil {
			t.Fatal(err)
		}
	}
	r2, r3 := <-got, <-got
	if !(r1.Seq < r2.Seq && r2.Seq < r3.Seq) {
		t.Fatalf("out of order: %d %d %d", r1.Seq, r2.Seq, r3.Seq)
	}
	select {
	case r := <-got:
		t.Fatalf("a record came twice or unasked: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("follow ended with %v", err)
	}
}

func TestSessionDrainRefusesNewInputsWhileAcceptedWorkFinishes(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	if _, err := h.client.Send(ctx, "default", api.SendRequest{Text: "before", SourceKey: "b"}); err != nil {
		t.Fatal(err)
	}
	done, err := h.sessions.Begin("default") // a turn in progress
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { _, err := h.client.DrainSession(ctx, "default"); drained <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for !h.sessions.Draining("default") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	_, err = h.client.Send(ctx, "default", api.SendRequest{Text: "during", SourceKey: "d"})
	var e *localclient.Error
	if !errors.As(err, &e) || e.Status != 409 || !strings.Contains(e.Message, "draining") {
		t.Fatalf("send during drain: %v", err)
	}
	done()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	s, _ := h.client.Session(ctx, "default")
	if s.State != store.StateStopped || s.Pending != 0 && s.Pending != 1 {
		t.Fatalf("after drain: %+v", s)
	}
	// A stopped session admits; the receipt says it waits for start.
	if res, err := h.client.Send(ctx, "default", api.SendRequest{Text: "after", SourceKey: "a"}); err != nil ||
		!strings.Contains(res.Unanswered, "will not be answered until `klbr-core start default`") {
		t.Fatalf("send to a stopped session: %+v %v", res, err)
	}
	if _, err := h.client.StopSession(ctx, "default"); !errors.As(err, &e) || e.Status != 409 {
		t.Fatalf("stop a stopped session: %v", err)
	}
	if _, err := h.client.StartSession(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Send(ctx, "default", api.SendRequest{Text: "after start", SourceKey: "s"}); err != nil {
		t.Fatal(err)
	}
	recs, _ := h.client.Records(ctx, "default", 0, 0)
	var kinds []string
	for _, r := range recs.Records {
		kinds = append(kinds, r.Kind)
	}
	want := "operator.input session.stopped operator.input session.ready operator.input"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("records %v, want %s", kinds, want)
	}
}

func TestDaemonDrainAndStopAreHandedToTheDaemon(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	if a, err := h.client.Drain(ctx); err != nil || !a.Accepted {
		t.Fatalf("drain: %+v %v", a, err)
	}
	if a, err := h.client.Stop(ctx); err != nil || !a.Accepted {
		t.Fatalf("stop: %+v %v", a, err)
	}
	h.daemon.mu.Lock()
	defer h.daemon.mu.Unlock()
	if fmt.Sprint(h.daemon.shutdown) != "[false true]" {
		t.Fatalf("daemon was asked %v", h.daemon.shutdown)
	}
}

func TestRecordsQueryBounds(t *testing.T) {
	h := start(t)
	for _, q := range []string{"since=-1", "since=x", "limit=0", "limit=100000"} {
		status, _ := rawRequest(t, h.sock, "GET", "/v1/sessions/default/records?"+q, "", 0)
		if status != 400 {
			t.Errorf("%s: status %d", q, status)
		}
	}
	if status, _ := rawRequest(t, h.sock, "GET", "/v1/sessions/nope/records", "", 0); status != 404 {
		t.Errorf("unknown session: %d", status)
	}
}

// A cursor past the session's last record (from another data directory, or a restored
// backup) is refused with cursor_past_end and the last record's seq, for a page and for a
// follow, instead of an empty page or a stream that stays silent until new records pass
// it; a cursor at the last record is the ordinary "nothing new".
func TestRecordsSincePastTheHeadSaysSo(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		if _, err := h.client.Send(ctx, "default", api.SendRequest{Text: k, SourceKey: k}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := h.client.Records(ctx, "default", 0, 0)
	if err != nil || len(all.Records) == 0 {
		t.Fatalf("records: %+v %v", all, err)
	}
	head := all.Records[len(all.Records)-1].Seq
	if page, err := h.client.Records(ctx, "default", head, 0); err != nil || len(page.Records) != 0 || page.More {
		t.Fatalf("at the head: %+v %v", page, err)
	}
	past := head + 1000
	_, err = h.client.Records(ctx, "default", past, 0)
	var e *localclient.Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || e.Code != api.CodeCursorPastEnd ||
		!strings.Contains(e.Message, fmt.Sprint(head)) {
		t.Fatalf("page past the head: %v", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = h.client.Follow(fctx, "default", past, func(store.Record) error { return nil })
	if !errors.As(err, &e) || e.Code != api.CodeCursorPastEnd {
		t.Fatalf("follow past the head: %v", err)
	}
}
