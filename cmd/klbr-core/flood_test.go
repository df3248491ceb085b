package main

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// floodConns is the outside test's flood: 20,000 idle connections to the HTTP port.
const floodConns = 20000

// TestHTTPFloodLeavesStatusAnswering: with 20,000 idle connections held open against the
// HTTP port (some having sent one request and kept the connection alive, most nothing at
// all), the operator's status over control.sock still answers, each time under 100 ms.
func TestHTTPFloodLeavesStatusAnswering(t *testing.T) {
	want := uint64(floodConns + 2000)
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	if lim.Cur < want {
		raised := unix.Rlimit{Cur: max(want, lim.Max), Max: max(want, lim.Max)}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
			raised = unix.Rlimit{Cur: lim.Max, Max: lim.Max}
			unix.Setrlimit(unix.RLIMIT_NOFILE, &raised)
		}
		t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &lim) })
	}
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	n := floodConns
	if lim.Cur < want {
		n = int(lim.Cur) - 2000
		t.Logf("RLIMIT_NOFILE is %d here and cannot be raised: flooding with %d connections", lim.Cur, n)
	}
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	// The daemon gets fewer descriptors than the flood has connections, as a daemon does
	// under systemd's default LimitNOFILE: without a bound on the listener, the flood would
	// take them all (the finding: status and send failed until it closed).
	daemonFDs := uint64(8192)
	if err := unix.Prlimit(srv.cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: daemonFDs, Max: daemonFDs}, nil); err != nil {
		t.Fatalf("prlimit the daemon: %v", err)
	}
	u, _ := url.Parse(srv.url)
	addr := u.Host

	statusOnce := func() time.Duration {
		start := time.Now()
		c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", in.sock)
		}}, Timeout: 10 * time.Second}
		resp, err := c.Get("http://klbr/v1/status")
		if err != nil {
			t.Fatalf("status during the flood: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status during the flood: %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	base := statusOnce()

	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4096)
	var connected, keptAlive int
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			if i%10 == 0 {
				// A keep-alive client: one request, then idle.
				c.SetDeadline(time.Now().Add(2 * time.Second))
				c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					resp.Body.Close()
					mu.Lock()
					keptAlive++
					mu.Unlock()
				}
				c.SetDeadline(time.Time{})
			}
			mu.Lock()
			conns = append(conns, c)
			connected++
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("flood: %d of %d connections established (%d kept alive after a request); status before: %s", connected, n, keptAlive, base)
	var lat []time.Duration
	for range 20 {
		lat = append(lat, statusOnce())
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("status during the flood: median %s, max %s", lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)-1] > 100*time.Millisecond {
		t.Fatalf("status took %s during the flood, want under 100 ms", lat[len(lat)-1])
	}
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
}
