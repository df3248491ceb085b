package daemon

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testClockEnv names a file that holds the child daemon's clock offset
// from the real time, in nanoseconds (TestDaemonChild): the test moves the
// daemon's clock by writing the file.
const testClockEnv = "KLBR_DAEMON_TEST_CLOCK"

// testClock is the real time plus an offset read from a file every 10 ms.
// Its timers fire when its time passes their deadline, so a moved clock
// ends the waits it passes at once.
type testClock struct {
	offset atomic.Int64
	moved  chan struct{} // closed and replaced when the offset changes
	mu     chan struct{} // a one-slot lock for moved
}

func startTestClock(ctx context.Context, file string) *testClock {
	c := &testClock{moved: make(chan struct{}), mu: make(chan struct{}, 1)}
	c.read(file)
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.read(file)
			}
		}
	}()
	return c
}

func (c *testClock) read(file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v == c.offset.Load() {
		return
	}
	c.offset.Store(v)
	c.mu <- struct{}{}
	close(c.moved)
	c.moved = make(chan struct{})
	<-c.mu
}

func (c *testClock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *testClock) after(d time.Duration) <-chan time.Time {
	deadline := c.now().Add(d)
	out := make(chan time.Time, 1)
	go func() {
		for {
			c.mu <- struct{}{}
			moved := c.moved
			<-c.mu
			now := c.now()
			if !now.Before(deadline) {
				out <- now
				return
			}
			select {
			case <-moved:
			case <-time.After(deadline.Sub(now)):
			}
		}
	}()
	return out
}

// setTestClock sets the daemon's clock to at by writing its offset file.
func setTestClock(t *testing.T, file string, at time.Time) {
	t.Helper()
	off := time.Until(at)
	if err := os.WriteFile(file+".tmp", []byte(strconv.FormatInt(int64(off), 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}
