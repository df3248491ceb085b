package web

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/httpguard"
)

// serveLikeDaemon returns the host:port of h's listener, which is wired as klbr-core
// wires its TCP port (see startWith).
func serveLikeDaemon(t testing.TB, h *harness) string {
	return strings.TrimPrefix(h.http.URL, "http://")
}

// raiseFiles raises this process's open-file limit to at least n (a flood holds both
// ends of every connection in this process).
func raiseFiles(t testing.TB, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	if rl.Max < n {
		citest.SkipOrFail(t, fmt.Sprintf("the open-file hard limit is %d; the flood needs %d (ulimit -Hn)", rl.Max, n))
	}
	rl.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
}

// flood holds n unauthenticated connections to addr from a child process (as other local
// users would, with a scheduler of their own), a third of each kind: slowloris (a request
// line and headers that never end, a line every 500 ms), idle TCP (nothing sent), and
// WebSocket upgrades without the token (sent again every 500 ms on the same connection).
// A connection the server closes is opened again at once, as an attacker who means to
// hold every connection would.
type flood struct {
	open, dialed, closed atomic.Int64 // now open; ever opened; closed by the server
	stopped              sync.WaitGroup
}

// Environment of a flood child (TestStrangerFloodChild).
const (
	floodAddrEnv = "KLBR_TEST_STRANGER_FLOOD_ADDR"
	floodNEnv    = "KLBR_TEST_STRANGER_FLOOD_N"
)

// floodStats is the line a flood child prints: once all its connections were opened,
// then when its stdin closes.
const floodStats = "flood dialed %d open %d closed %d\n"

// startFlood starts a flood child and returns once its n connections were opened; stop
// ends it and returns its counts.
func startFlood(t testing.TB, addr string, n int) (stop func() (dialed, open, closed int64)) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStrangerFloodChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), floodAddrEnv+"="+addr, floodNEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(stdout)
	var once sync.Once
	var d, o, c int64
	stop = func() (int64, int64, int64) {
		once.Do(func() {
			stdin.Close()
			fmt.Fscanf(out, floodStats, &d, &o, &c)
			cmd.Wait()
		})
		return d, o, c
	}
	t.Cleanup(func() { stop() })
	if _, err := fmt.Fscanf(out, floodStats, &d, &o, &c); err != nil {
		t.Fatalf("flood child: %v", err)
	}
	return stop
}

// TestStrangerFloodChild is the body of a flood child (startFlood).
func TestStrangerFloodChild(t *testing.T) {
	addr := os.Getenv(floodAddrEnv)
	if addr == "" {
		t.Skip("runs as the flood child of TestFloodOfStrangersLeavesTheOperatorIn")
	}
	n, _ := strconv.Atoi(os.Getenv(floodNEnv))
	raiseFiles(t, uint64(n)+1024)
	ctx, cancel := context.WithCancel(context.Background())
	f := &flood{}
	for i := range n {
		f.stopped.Go(func() { f.attacker(ctx, addr, i%3) })
	}
	for f.dialed.Load() < int64(n) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf(floodStats, f.dialed.Load(), f.open.Load(), f.closed.Load())
	io.Copy(io.Discard, os.Stdin)
	open := f.open.Load()
	cancel()
	f.stopped.Wait()
	fmt.Printf(floodStats, f.dialed.Load(), open, f.closed.Load())
}

const upgradeNoToken = "GET /v2/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

func (f *flood) attacker(ctx context.Context, addr string, kind int) {
	d := net.Dialer{Timeout: 30 * time.Second}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		f.dialed.Add(1)
		f.open.Add(1)
		f.hold(ctx, c, kind)
		f.open.Add(-1)
		c.Close()
	}
}

// hold plays one attack on c until the server closes it or ctx ends.
func (f *flood) hold(ctx context.Context, c net.Conn, kind int) {
	gone := make(chan struct{})
	go func() { // the server's close ends the hold
		io.Copy(io.Discard, c)
		close(gone)
	}()
	switch kind {
	case 0:
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	case 2:
		io.WriteString(c, upgradeNoToken)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.Close()
			<-gone
			return
		case <-gone:
			f.closed.Add(1)
			return
		case <-tick.C:
			switch kind {
			case 0:
				io.WriteString(c, "X-Slow: 1\r\n")
			case 2:
				io.WriteString(c, upgradeNoToken)
			}
		}
	}
}

// operatorLoad loads the browser client as an operator's browser does, with the token
// cookie: the page, its script, the status, and the socket up to its first records
// message. It returns how long that took.
func operatorLoad(ctx context.Context, addr string) (time.Duration, error) {
	t0 := time.Now()
	// A fresh transport: the load opens its own connections, as a browser that has
	// none open to klbr does.
	tr := &http.Transport{DisableKeepAlives: false}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for _, path := range []string{"/", "/ui/app.js", "/v2/status"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		req.Header.Set("Cookie", CookieName+"="+testToken)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, fmt.Errorf("GET %s: %w", path, err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %d %v", path, resp.StatusCode, err)
		}
	}
	hdr := http.Header{}
	hdr.Set("Cookie", CookieName+"="+testToken)
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v2/ws", &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: hc})
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"hello","session":"default","cursor":0,"tail":200}`)); err != nil {
		return 0, fmt.Errorf("hello: %w", err)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("socket read: %w", err)
		}
		if strings.Contains(string(b), `"type":"records"`) {
			return time.Since(t0), nil
		}
	}
}

// 3,000 connections without the token, held open (partial headers, idle TCP, refused
// WebSocket upgrades, each reopened as soon as the server closes it), do not stop an
// operator with the token from loading the browser client.
func TestFloodOfStrangersLeavesTheOperatorIn(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 3,000 connections")
	}
	h := start(t)
	h.admitN(t, 20, "r", 100)
	addr := serveLikeDaemon(t, h)
	stop := startFlood(t, addr, 3000)
	// A generous bound for each load: without a place for the operator it waits for
	// the header timeouts of thousands of strangers (minutes); with one it takes
	// milliseconds (BenchmarkOperatorUnderFlood).
	for i := range 3 {
		if i > 0 {
			// Later loads come after the strangers of the first have reached the end of
			// their life and been replaced: the flood in its steady state.
			time.Sleep(httpguard.DefaultStrangerLife / 2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		took, err := operatorLoad(ctx, addr)
		cancel()
		if err != nil {
			t.Fatalf("load %d under a flood of 3,000 strangers: %v (gate %+v)", i, err, h.srv.GateStats())
		}
		t.Logf("load %d: %v (gate %+v)", i, took, h.srv.GateStats())
	}
	dialed, open, closed := stop()
	t.Logf("flood: %d connections dialed, %d open at its end, %d closed by the server", dialed, open, closed)
	if open < 1000 {
		t.Fatalf("only %d strangers were open at the flood's end: the test proves nothing", open)
	}
}

// BenchmarkOperatorUnderFlood measures an operator's page load (operatorLoad) with no other
// client and under a flood of 3,000 strangers (TestFloodOfStrangersLeavesTheOperatorIn).
func BenchmarkOperatorUnderFlood(b *testing.B) {
	for _, n := range []int{0, 3000} {
		b.Run(fmt.Sprintf("strangers=%d", n), func(b *testing.B) {
			h := start(b)
			h.admitN(b, 20, "r", 100)
			addr := serveLikeDaemon(b, h)
			if n > 0 {
				startFlood(b, addr, n)
				// Timed in the flood's steady state: its first strangers have reached the
				// end of their life and been replaced.
				time.Sleep(httpguard.DefaultStrangerLife + time.Second)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				took, err := operatorLoad(ctx, addr)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, took)
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		})
	}
}

// A flood of requests without the token writes a line now and then, not one per request
// (the journal is not the flood's amplifier); the lines that are written count the others.
func TestRefusalsDoNotFloodTheLog(t *testing.T) {
	h := start(t)
	hc := &http.Client{}
	for range 200 {
		resp, err := hc.Get(h.http.URL + "/v2/status")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := strings.Count(h.logs.String(), "browser: refused"); n > 5 {
		t.Fatalf("200 refused requests wrote %d log lines", n)
	}
}
