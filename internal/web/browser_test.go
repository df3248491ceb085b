package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/store"
)

func noRedirect() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, url string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func TestAccessToken(t *testing.T) {
	h := start(t)
	c := noRedirect()
	cookie := http.Header{"Cookie": {CookieName + "=" + testToken}}

	for _, tc := range []struct {
		name, path string
		hdr        http.Header
		want       int
	}{
		{"healthz is open", "/healthz", nil, 200},
		{"metrics is open", "/metrics", nil, 200},
		{"page without token", "/", nil, 401},
		{"page with wrong cookie", "/", http.Header{"Cookie": {CookieName + "=" + strings.Repeat("0", 64)}}, 401},
		{"page with wrong URL token", "/?token=nope", nil, 401},
		{"asset without token", "/ui/app.js", nil, 401},
		{"status without token", "/v2/status", nil, 401},
		{"unknown path without token", "/etc/passwd", nil, 401},
		{"page with cookie", "/", cookie, 200},
		{"asset with cookie", "/ui/app.js", cookie, 200},
		{"status with cookie", "/v2/status", cookie, 200},
		{"status with bearer", "/v2/status", http.Header{"Authorization": {"Bearer " + testToken}}, 200},
		{"unknown path with cookie", "/nope", cookie, 404},
	} {
		res, body := get(t, c, h.http.URL+tc.path, tc.hdr)
		if res.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, res.StatusCode, tc.want)
		}
		page := tc.path == "/" || strings.HasPrefix(tc.path, "/?")
		if tc.want == 401 && !page && body != "" {
			t.Errorf("%s: refusal has content %q", tc.name, body)
		}
		// The page itself, refused, says how to get in, and gives nothing away.
		if tc.want == 401 && page && (!strings.Contains(body, "klbr-core open") || strings.Contains(body, testToken) ||
			!strings.HasPrefix(res.Header.Get("Content-Type"), "text/html")) {
			t.Errorf("%s: sign-in page %q (%s)", tc.name, body, res.Header.Get("Content-Type"))
		}
	}

	// ?token= sets the cookie and redirects without it.
	res, _ := get(t, c, h.http.URL+"/?token="+testToken+"&session=default", nil)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("token URL: status %d, want 303", res.StatusCode)
	}
	if loc := res.Header.Get("Location"); loc != "/?session=default" {
		t.Errorf("redirect to %q, want the URL without the token", loc)
	}
	var got *http.Cookie
	for _, ck := range res.Cookies() {
		if ck.Name == CookieName {
			got = ck
		}
	}
	if got == nil || got.Value != testToken || !got.HttpOnly || got.SameSite != http.SameSiteStrictMode || got.Path != "/" {
		t.Fatalf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/ with the token", got)
	}
	// It outlives the browser session: Max-Age, 30 days unless configured.
	if got.MaxAge != 30*24*3600 {
		t.Errorf("cookie Max-Age %d, want %d (30 days)", got.MaxAge, 30*24*3600)
	}

	// A path that looks protocol-relative stays on this host.
	res, _ = get(t, c, h.http.URL+"//evil.example/?token="+testToken, nil)
	if loc := res.Header.Get("Location"); !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") {
		t.Errorf("redirect to %q, want a local path", loc)
	}

	// /v2/status is the daemon's status.
	res, body := get(t, c, h.http.URL+"/v2/status", cookie)
	if ct := res.Header.Get("Content-Type"); ct != "application/json" || !strings.Contains(body, `"default"`) {
		t.Errorf("status: %s %s", ct, body)
	}
}

func TestCookieMaxAgeAndRotation(t *testing.T) {
	h := startWith(t, func(_ *harness, b *Browser) { b.CookieMaxAge = 7 * 24 * time.Hour })
	c := noRedirect()
	res, _ := get(t, c, h.http.URL+"/?token="+testToken, nil)
	if ck := res.Cookies(); len(ck) != 1 || ck[0].MaxAge != 7*24*3600 {
		t.Fatalf("cookies %+v, want one with Max-Age 7 days", ck)
	}
	_, body := get(t, c, h.http.URL+"/", nil)
	if !strings.Contains(body, "7 days") {
		t.Errorf("the sign-in page does not say how long a login lasts: %q", body)
	}
	old, _, err := h.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.CloseNow()
	writeJSON(t, old, map[string]any{"type": "hello", "session": "default", "cursor": 0})
	collect(t, old) // caught up: the socket is served

	newTok := strings.Repeat("ab", 32)
	if err := h.srv.RotateToken(newTok); err != nil {
		t.Fatal(err)
	}
	if code := closeStatus(t, old); code != websocket.StatusPolicyViolation {
		t.Errorf("open socket after rotation: close %v, want 1008", code)
	}
	cookie := http.Header{"Cookie": {CookieName + "=" + testToken}}
	if res, body := get(t, c, h.http.URL+"/", cookie); res.StatusCode != 401 || !strings.Contains(body, "klbr-core open") {
		t.Errorf("old cookie after rotation: %d %q, want the sign-in page", res.StatusCode, body)
	}
	if res, _ := get(t, c, h.http.URL+"/v2/status", cookie); res.StatusCode != 401 {
		t.Errorf("old cookie on /v2/status: %d, want 401", res.StatusCode)
	}
	if res, _ := get(t, c, h.http.URL+"/v2/status", http.Header{"Cookie": {CookieName + "=" + newTok}}); res.StatusCode != 200 {
		t.Errorf("new token: %d, want 200", res.StatusCode)
	}
	if err := h.srv.RotateToken("short"); err == nil {
		t.Error("a short token was accepted")
	}
}

func TestWebSocketRefusals(t *testing.T) {
	h := start(t)
	port := h.http.URL[strings.LastIndex(h.http.URL, ":"):]
	for _, tc := range []struct {
		name string
		hdr  http.Header
		want int
	}{
		{"missing token", http.Header{"Cookie": {"other=1"}}, 403},
		{"wrong token", http.Header{"Cookie": {CookieName + "=" + strings.Repeat("f", 64)}}, 403},
		{"token in URL is not enough for the socket", http.Header{"Cookie": {"x=1"}}, 403},
		{"foreign origin", http.Header{"Origin": {"http://evil.example" + port}}, 403},
		{"loopback origin on another port", http.Header{"Origin": {"http://127.0.0.1:1"}}, 403},
		{"origin with a path", http.Header{"Origin": {"http://127.0.0.1" + port + "/x"}}, 403},
		{"null origin", http.Header{"Origin": {"null"}}, 403},
		{"file origin", http.Header{"Origin": {"file://"}}, 403},
	} {
		c, res, err := h.dial(t, tc.hdr)
		if err == nil {
			c.CloseNow()
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if res == nil || res.StatusCode != tc.want {
			t.Errorf("%s: %v, want %d", tc.name, err, tc.want)
			continue
		}
		if b, _ := io.ReadAll(res.Body); len(b) != 0 {
			t.Errorf("%s: refusal has content %q", tc.name, b)
		}
	}
	for _, origin := range []string{"http://127.0.0.1" + port, ""} {
		c, _, err := h.dial(t, http.Header{"Origin": {origin}})
		if err != nil {
			t.Errorf("origin %q: %v", origin, err)
			continue
		}
		c.CloseNow()
	}
	if !originOKFor("http://localhost:8765", "localhost:8765") || !originOKFor("http://[::1]:8765", "[::1]:8765") ||
		originOKFor("http://localhost.evil.com:8765", "localhost.evil.com:8765") || originOKFor("http://10.0.0.1:8765", "10.0.0.1:8765") {
		t.Error("originOK misjudges loopback origins")
	}
}

func originOKFor(origin, host string) bool {
	r, _ := http.NewRequest("GET", "http://"+host+"/v2/ws", nil)
	r.Header.Set("Origin", origin)
	return originOK(r)
}

func closeStatus(t *testing.T, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	for range 1000 {
		if _, err := tryRead(c, 5*time.Second); err != nil {
			return websocket.CloseStatus(err)
		}
	}
	t.Fatal("the connection stayed open")
	return 0
}

func TestOversizedAndBadFrames(t *testing.T) {
	h := start(t)
	c := h.hello(t, 0)
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgRecords || m.More {
		t.Fatalf("first message %+v", m)
	}
	// A malformed message is answered with an error; the socket stays.
	ctx := context.Background()
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"send","text":"x","key":"k","admin":true}`))
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgError || m.Code != "invalid" {
		t.Fatalf("malformed: %+v", m)
	}
	big := `{"type":"send","key":"k","text":"` + strings.Repeat("a", MaxClientFrame) + `"}`
	c.Write(ctx, websocket.MessageText, []byte(big))
	if st := closeStatus(t, c); st != websocket.StatusPolicyViolation {
		t.Fatalf("oversized frame: close status %v, want policy violation", st)
	}
	if recs, _ := h.st.Records(ctx, "default", 0, 10); len(recs) != 0 {
		t.Fatalf("an oversized frame was admitted: %d records", len(recs))
	}

	// The first message must be a hello, for a known session.
	for _, first := range []string{`{"type":"send","text":"x","key":"k"}`, `{"type":"hello","session":"nope","cursor":0}`, `not json`} {
		c, _, err := h.dial(t, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(ctx, websocket.MessageText, []byte(first))
		if st := closeStatus(t, c); st != websocket.StatusPolicyViolation {
			t.Errorf("first message %s: close status %v", first, st)
		}
	}
}

// collect reads records messages until one has more=false, checking that
// only the last one ends the replay, and returns the records and the count
// of messages.
func collect(t *testing.T, c *websocket.Conn) ([]store.Record, int) {
	t.Helper()
	var out []store.Record
	for n := 1; ; n++ {
		m := readMsg(t, c, 10*time.Second)
		if m.Type != MsgRecords {
			t.Fatalf("got %s during replay", m.Type)
		}
		if len(m.Records) > ReplayPage {
			t.Fatalf("a page of %d records, at most %d", len(m.Records), ReplayPage)
		}
		out = append(out, m.Records...)
		if !m.More {
			return out, n
		}
	}
}

func TestReplayFromCursor(t *testing.T) {
	h := start(t)
	h.admitN(t, 1234, "r", 0)
	all, err := h.st.Records(context.Background(), "default", 0, store.MaxRecordsPage)
	if err != nil {
		t.Fatal(err)
	}
	more, _ := h.st.Records(context.Background(), "default", all[len(all)-1].Seq, store.MaxRecordsPage)
	all = append(all, more...)
	if len(all) != 1234 {
		t.Fatalf("%d records stored", len(all))
	}
	cursor := all[99].Seq
	want := all[100:]

	c := h.hello(t, cursor)
	got, msgs := collect(t, c)
	if msgs != 4 {
		// The first page is small (the records' size is not known yet), then pages of
		// ReplayPage small records.
		t.Errorf("%d records messages, want 4 (%d, 500, 500, %d)", msgs, replayFirstPage, 1134-replayFirstPage-1000)
	}
	if len(got) != len(want) {
		t.Fatalf("replayed %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].ID != want[i].ID || got[i].Kind != want[i].Kind {
			t.Fatalf("record %d: got seq %d id %d, want seq %d id %d", i, got[i].Seq, got[i].ID, want[i].Seq, want[i].ID)
		}
	}
	// Nothing more arrives: each record once.
	if m, err := tryRead(c, 300*time.Millisecond); err == nil {
		t.Fatalf("after the replay: %+v", m)
	}

	// A cursor at the end replays nothing, with an explicit empty page.
	c2 := h.hello(t, all[len(all)-1].Seq)
	if got, _ := collect(t, c2); len(got) != 0 {
		t.Fatalf("replayed %d records after the last cursor", len(got))
	}
}

func TestReplayBoundsMessageBytes(t *testing.T) {
	h := start(t)
	h.admitN(t, 40, "big", 60<<10) // 2.4 MB of content
	c := h.hello(t, 0)
	var got []store.Record
	msgs := 0
	for {
		m := readMsg(t, c, 10*time.Second)
		msgs++
		size := 0
		for _, r := range m.Records {
			size += len(r.Content)
		}
		if size > MaxMessageBytes {
			t.Fatalf("a message of %d bytes of content", size)
		}
		got = append(got, m.Records...)
		if !m.More {
			break
		}
	}
	if len(got) != 40 || msgs < 3 {
		t.Fatalf("%d records in %d messages, want 40 in at least 3", len(got), msgs)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("out of order at %d", i)
		}
	}
}

func TestLiveSendAndReconnect(t *testing.T) {
	h := start(t)
	h.admitN(t, 3, "old", 0)
	c := h.hello(t, 0)
	seen := map[int64]int{}
	var last int64
	note := func(recs []store.Record) {
		for _, r := range recs {
			seen[r.ID]++
			if r.Seq <= last {
				t.Fatalf("seq %d after %d", r.Seq, last)
			}
			last = r.Seq
		}
	}
	recs, _ := collect(t, c)
	note(recs)

	// Send through the socket: the receipt comes after the commit.
	writeJSON(t, c, map[string]any{"type": "send", "text": "hello from the browser", "key": "k1"})
	var receipt serverMsg
	for receipt.Type == "" || len(seen) < 4 {
		m := readMsg(t, c, 5*time.Second)
		switch m.Type {
		case MsgReceipt:
			receipt = m
		case MsgRecords:
			note(m.Records)
		default:
			t.Fatalf("unexpected %+v", m)
		}
	}
	if receipt.Key != "k1" || receipt.Duplicate || receipt.EventID == 0 {
		t.Fatalf("receipt %+v", receipt)
	}
	if _, ok := seen[receipt.EventID]; !ok {
		t.Fatalf("the sent input (event %d) did not stream", receipt.EventID)
	}
	// A retry with the same key is a duplicate and adds no record.
	writeJSON(t, c, map[string]any{"type": "send", "text": "hello from the browser", "key": "k1"})
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgReceipt || !m.Duplicate || m.EventID != receipt.EventID {
		t.Fatalf("retry: %+v", m)
	}
	// An input admitted elsewhere streams live.
	h.admitN(t, 2, "live", 0)
	for len(seen) < 6 {
		m := readMsg(t, c, 5*time.Second)
		note(m.Records)
	}
	c.Close(websocket.StatusNormalClosure, "")

	// Commits while disconnected, then reconnect with the last cursor.
	h.admitN(t, 2, "gap", 0)
	c2 := h.hello(t, last)
	recs, _ = collect(t, c2)
	note(recs)
	h.admitN(t, 1, "after", 0)
	for len(seen) < 9 {
		note(readMsg(t, c2, 5*time.Second).Records)
	}
	if m, err := tryRead(c2, 300*time.Millisecond); err == nil {
		t.Fatalf("extra message %+v", m)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %d delivered %d times", id, n)
		}
	}
	all, _ := h.st.Records(context.Background(), "default", 0, 100)
	if len(all) != len(seen) {
		t.Errorf("store has %d records, client saw %d", len(all), len(seen))
	}
}

func TestLanesKeepTheirKinds(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	h.admitN(t, 1, "in", 0)
	err := h.st.Write(ctx, func(tx *store.Tx) error {
		gen, err := tx.NextKernelGeneration("default", map[string]any{"pid": 1})
		if err != nil {
			return err
		}
		id, _, err := tx.StartExecution("default", gen, "print('hi')", nil)
		if err != nil {
			return err
		}
		if err := tx.FinishExecution("default", id, "ok", false, json.RawMessage(`{"status":"ok","output":{"preview":[{"stream":"stdout","origin":"execution","data":"hi\n"}]}}`)); err != nil {
			return err
		}
		return tx.KernelReset("default", gen, "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sessions.Transition(ctx, "default", store.StateStopped, "test"); err != nil {
		t.Fatal(err)
	}
	c := h.hello(t, 0)
	recs, _ := collect(t, c)
	want := map[string]store.Lane{
		"operator.input": store.LaneInput, "kernel.started": store.LaneNotice, "cell.started": store.LaneCell,
		"cell.finished": store.LaneCell, "kernel.reset": store.LaneNotice, "session.stopped": store.LaneNotice,
	}
	got := map[string]store.Lane{}
	for _, r := range recs {
		got[r.Kind] = r.Lane
		if len(r.Content) == 0 || r.ID == 0 || r.Seq == 0 || r.Session != "default" {
			t.Errorf("record %+v lacks fields", r)
		}
	}
	for k, lane := range want {
		if got[k] != lane {
			t.Errorf("%s in lane %q, want %q", k, got[k], lane)
		}
	}
	// A stopped session admits input; the receipt says it waits for start.
	writeJSON(t, c, map[string]any{"type": "send", "text": "x", "key": "k"})
	m := readMsg(t, c, 5*time.Second)
	if m.Type == MsgRecords { // the input's own record may come first
		m = readMsg(t, c, 5*time.Second)
	}
	if m.Type != MsgReceipt || m.Key != "k" || !strings.Contains(m.Unanswered, "not be answered until `klbr-core start default`") {
		t.Fatalf("send to a stopped session: %+v", m)
	}
}

func TestDrainStopAndClosing(t *testing.T) {
	h := start(t)
	c := h.hello(t, 0)
	collect(t, c)
	writeJSON(t, c, map[string]any{"type": "drain"})
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgAccepted || m.Action != "drain" {
		t.Fatalf("drain: %+v", m)
	}
	writeJSON(t, c, map[string]any{"type": "stop"})
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgAccepted || m.Action != "stop" {
		t.Fatalf("stop: %+v", m)
	}
	// The answer is queued before the daemon is told: wait for the call.
	var calls []bool
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		h.daemon.mu.Lock()
		calls = append([]bool(nil), h.daemon.shutdown...)
		h.daemon.mu.Unlock()
		if len(calls) == 2 {
			break
		}
	}
	if len(calls) != 2 || calls[0] || !calls[1] {
		t.Fatalf("shutdown calls %v, want [false true]", calls)
	}
	close(h.daemon.closing)
	if st := closeStatus(t, c); st != websocket.StatusGoingAway {
		t.Fatalf("closing: status %v, want going away", st)
	}
}

// shrinkNextSendBuffer makes the harness serve on a listener that gives the
// next connection it accepts a fixed, small send buffer. With a client that
// has a small receive buffer too, a few hundred KiB unread then block the
// server's writes to it (on this machine loopback buffers otherwise grow to
// tens of MiB and hide a stalled reader). Only that connection is shrunk:
// small loopback buffers also slow a reader that keeps up.
func (h *harness) shrinkNextSendBuffer(t *testing.T, size int) {
	t.Helper()
	h.http.Close()
	srv := httptest.NewUnstartedServer(h.srv.Handler())
	l := &sendBufListener{Listener: srv.Listener, size: size}
	l.armed.Store(true)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	h.http = srv
}

type sendBufListener struct {
	net.Listener
	size  int
	armed atomic.Bool
}

func (l *sendBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && l.armed.Swap(false) {
		if err := tc.SetWriteBuffer(l.size); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, err
}

func TestSlowClientIsDropped(t *testing.T) {
	h := start(t)
	h.shrinkNextSendBuffer(t, 32<<10)
	h.srv.browser.writeTimeout = 500 * time.Millisecond
	slow := h.helloSmallBuffer(t, 0) // reads its first page, then nothing
	if m := readMsg(t, slow, 5*time.Second); m.Type != MsgRecords {
		t.Fatalf("first message %+v", m)
	}
	fast := h.hello(t, 0)
	collect(t, fast)

	// 200 records of 60 KiB, committed in 40 batches: 12 MiB, far more
	// than the slow client's buffers and its queue can hold.
	const batches, perBatch, body = 40, 5, 60 << 10
	type result struct {
		got     int
		lastLag time.Duration
		err     error
	}
	done := make(chan result, 1)
	var committed atomic.Int64 // unix nanos of the last commit
	go func() {
		var r result
		for r.got < batches*perBatch {
			m, err := tryRead(fast, 10*time.Second)
			if err != nil {
				r.err = err
				break
			}
			r.got += len(m.Records)
		}
		r.lastLag = time.Since(time.Unix(0, committed.Load()))
		done <- r
	}()
	t0 := time.Now()
	for i := range batches {
		h.admitN(t, perBatch, "b"+itoa(i), body)
		committed.Store(time.Now().UnixNano())
	}
	r := <-done
	if r.err != nil || r.got != batches*perBatch {
		t.Fatalf("the fast client stopped after %d records: %v; log:\n%s", r.got, r.err, h.logs.String())
	}
	t.Logf("the fast client got all %d records (%d MiB) in %v, %v after the last commit",
		r.got, batches*perBatch*body>>20, time.Since(t0).Round(time.Millisecond), r.lastLag.Round(time.Millisecond))

	// The slow client is cut: the server drops it within about the write
	// timeout of its writes blocking, and it reads only what its buffers
	// held before the connection ends.
	deadline := time.Now().Add(5 * time.Second)
	for h.srv.browser.slowDrops.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow client was not dropped; log:\n%s", h.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	read := 0
	var err error
	for err == nil {
		var m serverMsg
		m, err = tryRead(slow, 5*time.Second)
		read += len(m.Records)
	}
	if errors.Is(err, context.DeadlineExceeded) || read >= batches*perBatch {
		t.Fatalf("the slow client read %d records and then %v; want fewer, then the end of the connection", read, err)
	}
	t.Logf("the slow client read %d of %d records before the server cut it (%v)", read, batches*perBatch, err)
	if n := h.srv.browser.slowDrops.Load(); n != 1 {
		t.Errorf("%d clients dropped, want 1", n)
	}
	if !strings.Contains(h.logs.String(), "dropping") {
		t.Errorf("no log says the client was dropped:\n%s", h.logs.String())
	}
}

// A replay that ends exactly on a page boundary still ends: the last full
// page says more, and an empty page with more=false follows.
func TestReplayEndsOnAPageBoundary(t *testing.T) {
	h := start(t)
	h.admitN(t, 2*ReplayPage, "p", 0)
	c := h.hello(t, 0)
	got, msgs := collect(t, c)
	if len(got) != 2*ReplayPage || msgs != 3 {
		t.Fatalf("%d records in %d messages, want %d in 3 (two full pages, then the end)", len(got), msgs, 2*ReplayPage)
	}
	// Live records after it stream as usual, each once.
	h.admitN(t, 1, "live", 0)
	if m := readMsg(t, c, 5*time.Second); m.Type != MsgRecords || len(m.Records) != 1 || m.More {
		t.Fatalf("live after the replay: %+v", m)
	}
}

// A hello with cursor 0 and a tail gets a bounded snapshot: a window message
// saying how many records it leaves out, then exactly the last tail records,
// then live ones. A reconnect with a cursor ignores the tail.
func TestTailSnapshot(t *testing.T) {
	h := start(t)
	h.admitN(t, 1200, "r", 0)
	all, err := h.st.Records(context.Background(), "default", 0, store.MaxRecordsPage)
	if err != nil {
		t.Fatal(err)
	}
	more, _ := h.st.Records(context.Background(), "default", all[len(all)-1].Seq, store.MaxRecordsPage)
	all = append(all, more...)
	c, _, err := h.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(8 << 20)
	t.Cleanup(func() { c.CloseNow() })
	writeJSON(t, c, map[string]any{"type": "hello", "session": "default", "cursor": 0, "tail": 700})
	var w struct {
		Type    string `json:"type"`
		Earlier int64  `json:"earlier"`
		From    int64  `json:"from"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(b, &w)
	if w.Type != MsgWindow || w.Earlier != int64(len(all)-700) || w.From != all[len(all)-701].Seq {
		t.Fatalf("window: %+v (records %d)", w, len(all))
	}
	got, _ := collect(t, c)
	if len(got) != 700 || got[0].Seq != all[len(all)-700].Seq || got[699].Seq != all[len(all)-1].Seq {
		t.Fatalf("snapshot: %d records from %d", len(got), got[0].Seq)
	}
	// Small sessions: no window message, everything.
	h2 := start(t)
	h2.admitN(t, 5, "s", 0)
	c2, _, err := h2.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.CloseNow() })
	writeJSON(t, c2, map[string]any{"type": "hello", "session": "default", "cursor": 0, "tail": 700})
	if got, _ := collect(t, c2); len(got) != 5 {
		t.Fatalf("a small session: %d records", len(got))
	}
	// A reconnect with a cursor reads after it, whatever the tail.
	c3, _, err := h.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	c3.SetReadLimit(8 << 20)
	t.Cleanup(func() { c3.CloseNow() })
	writeJSON(t, c3, map[string]any{"type": "hello", "session": "default", "cursor": all[99].Seq, "tail": 10})
	if got, _ := collect(t, c3); len(got) != len(all)-100 {
		t.Fatalf("a reconnect: %d records, want %d", len(got), len(all)-100)
	}
}

// TestCursorPastTheEnd: a hello whose cursor is past the last record gets an error that
// says so and a fresh snapshot, not silence.
func TestCursorPastTheEnd(t *testing.T) {
	h := start(t)
	h.admitN(t, 5, "p", 0)
	c := h.hello(t, 1_000_000)
	m, err := tryRead(c, 5*time.Second)
	if err != nil {
		t.Fatalf("a cursor past the end got nothing: %v", err)
	}
	if m.Type != MsgError || !strings.Contains(m.Message, "past the last record") {
		t.Fatalf("first message %+v, want an error about the cursor", m)
	}
	got, _ := collect(t, c)
	if len(got) != 5 {
		t.Fatalf("snapshot after the error: %d records, want 5", len(got))
	}
}

// TestForeignHostIsRefused: every endpoint of the HTTP listener, /metrics and /healthz
// included, refuses a Host that is not a loopback name (DNS rebinding).
func TestForeignHostIsRefused(t *testing.T) {
	h := start(t)
	for _, path := range []string{"/metrics", "/healthz", "/", "/v2/ws"} {
		req, _ := http.NewRequest("GET", h.http.URL+path, nil)
		req.Host = "rebound.example:8765"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("%s with a foreign Host: %d, want 421", path, resp.StatusCode)
		}
	}
	resp, err := http.Get(h.http.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz on 127.0.0.1: %v %v", resp, err)
	}
	resp.Body.Close()
}
