package unixsock

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestWorkersTakeNoSlot: idle connections from workers are turned away without taking a
// slot of the bounded listener; a worker that sends a request reads 403; a non-worker is
// served meanwhile.
func TestWorkersTakeNoSlot(t *testing.T) {
	dir, err := os.MkdirTemp("", "klbr-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	raw, err := Listen(sock, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	var worker atomic.Bool
	worker.Store(true)
	l := LimitListener(FilterWorkers(raw, func(int) string {
		if worker.Load() {
			return "a test worker"
		}
		return ""
	}), 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("served")) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	var idle []net.Conn
	for range 50 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil && resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a worker's request answered %d, want 403", resp.StatusCode)
	}
	c.Close()

	time.Sleep(100 * time.Millisecond) // the classifications of the idle ones are done
	worker.Store(false)
	cl := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	resp, err := cl.Get("http://x/")
	if err != nil {
		t.Fatalf("the operator was not served while 50 worker connections idled: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("operator: %d", resp.StatusCode)
	}
}
