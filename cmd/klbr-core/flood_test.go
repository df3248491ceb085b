package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// floodConns is the outside test's flood: 20,000 connections to the HTTP port.
const floodConns = 20000

// Two flooder processes hold the connections (each under its own descriptor limit), so the
// flood can reach its full size whatever this test process may hold.
const (
	flooderAddrEnv = "KLBR_TEST_FLOOD_ADDR"
	flooderNEnv    = "KLBR_TEST_FLOOD_N"
	flooders       = 2
)

// TestFlooder is a flooder's body when the test binary runs as one (see floodFrom): it
// opens its connections, says how many it holds, and holds them until stdin closes.
func TestFlooder(t *testing.T) {
	addr := os.Getenv(flooderAddrEnv)
	if addr == "" {
		t.Skip("runs as a flooder process of TestHTTPFloodLeavesStatusAnswering")
	}
	n, _ := strconv.Atoi(os.Getenv(flooderNEnv))
	conns, keptAlive := flood(addr, n)
	fmt.Printf("holding %d %d\n", len(conns), keptAlive)
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

// flood opens n connections to addr from many dialers; every tenth sends one request and
// keeps its connection alive, the rest send nothing.
func flood(addr string, n int) (conns []net.Conn, keptAlive int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2048)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			alive := false
			if i%10 == 0 {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					resp.Body.Close()
					alive = true
				}
				c.SetDeadline(time.Time{})
			}
			mu.Lock()
			conns = append(conns, c)
			if alive {
				keptAlive++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return conns, keptAlive
}

// TestHTTPFloodLeavesStatusAnswering: with 20,000 connections flooding the HTTP port (held
// by two flooder processes; some sent one request and keep the connection alive, most sent
// nothing), the operator's status over control.sock still answers, each time under 100 ms.
func TestHTTPFloodLeavesStatusAnswering(t *testing.T) {
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

	held, keptAlive := 0, 0
	for range flooders {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestFlooder$", "-test.v=false")
		cmd.Env = append(os.Environ(), flooderAddrEnv+"="+u.Host, flooderNEnv+"="+strconv.Itoa(floodConns/flooders))
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Wait() })
		var h, k int
		if _, err := fmt.Fscanf(bufio.NewReader(stdout), "holding %d %d\n", &h, &k); err != nil {
			t.Fatalf("flooder: %v", err)
		}
		held, keptAlive = held+h, keptAlive+k
	}
	t.Logf("flood: %d connections dialled, %d established and held (%d kept alive after a request); status before: %s", floodConns, held, keptAlive, base)
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
