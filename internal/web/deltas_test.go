package web

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/live"
)

// readDeltas reads messages until want delta items have arrived (records
// messages are skipped) and returns them.
func readDeltas(t *testing.T, c *websocket.Conn, want int) []deltaItem {
	t.Helper()
	var got []deltaItem
	for len(got) < want {
		m := readMsg(t, c, 5*time.Second)
		switch m.Type {
		case MsgDelta:
			if len(m.Deltas) == 0 {
				t.Fatal("an empty delta message")
			}
			got = append(got, m.Deltas...)
		case MsgRecords:
		default:
			t.Fatalf("unexpected %+v", m)
		}
	}
	return got
}

func TestDeltasStreamToTheirSession(t *testing.T) {
	h := start(t)
	h.admitN(t, 2, "before", 0)
	c := h.hello(t, 0)
	collect(t, c)
	h.waitSubscribed(t, c)

	h.deltas.Publish(live.Delta{Session: "other", Attempt: 9, Step: 9, Kind: "content", Text: "not for this socket"})
	for _, piece := range []string{"Let me ", "think ", "about it."} {
		h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 3, Kind: "content", Text: piece})
	}
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 3, Kind: "tool", Call: "call_1", Text: `{"code":"1+1"}`})
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 3, Kind: "end"})

	// Deltas may arrive in one message or several, coalesced or not; what
	// the client rebuilds is the same.
	var text, tool strings.Builder
	ended := false
	for !ended {
		for _, d := range readDeltas(t, c, 1) {
			if d.Attempt != 1 || d.Step != 3 {
				t.Fatalf("a delta of another step: %+v", d)
			}
			switch d.Kind {
			case "content":
				text.WriteString(d.Text)
			case "tool":
				if d.Call != "call_1" {
					t.Fatalf("tool delta without its call: %+v", d)
				}
				tool.WriteString(d.Text)
			case "end":
				ended = true
			default:
				t.Fatalf("kind %q", d.Kind)
			}
		}
	}
	if text.String() != "Let me think about it." || tool.String() != `{"code":"1+1"}` {
		t.Fatalf("rebuilt %q and %q", text.String(), tool.String())
	}
	// A delta is not a record: it moves no cursor, and a reconnect replays
	// nothing of it.
	if m, err := tryRead(c, 200*time.Millisecond); err == nil {
		t.Fatalf("extra message %+v", m)
	}
	c2 := h.hello(t, 0)
	recs, _ := collect(t, c2)
	if len(recs) != 2 {
		t.Fatalf("replay after deltas: %d records, want the 2 inputs", len(recs))
	}
}

// waitSubscribed returns once the socket c gets the session's deltas: it
// publishes probes (attempt 0, step 0) until one arrives, then an end, and
// reads up to the end so no probe is left to read.
func (h *harness) waitSubscribed(t *testing.T, c *websocket.Conn) {
	t.Helper()
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				h.deltas.Publish(live.Delta{Session: "default", Kind: "end"})
				return
			case <-tick.C:
				h.deltas.Publish(live.Delta{Session: "default", Kind: "content", Text: "probe"})
			}
		}
	}()
	readDeltas(t, c, 1)
	close(stop)
	for {
		for _, d := range readDeltas(t, c, 1) {
			if d.Kind == "end" && d.Attempt == 0 {
				return
			}
		}
	}
}

// testClient is a client without a socket, for the queue policy.
func testClient() *client {
	b := &browser{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return &client{b: b, queue: make(chan []byte, SendQueue), sent: make(chan struct{}, 1),
		done: make(chan struct{}), deltaReady: make(chan struct{}, 1)}
}

func TestDeltasAreDroppedFirst(t *testing.T) {
	d := func(step int64, kind, text string) live.Delta {
		return live.Delta{Session: "s", Attempt: 1, Step: step, Kind: kind, Text: text}
	}
	t.Run("coalesced while the writer is busy", func(t *testing.T) {
		c := testClient()
		for range 100 {
			c.pushDelta(d(1, "content", "ab"))
		}
		c.pushDelta(d(1, "reasoning", "r"))
		if n := len(c.deltas.items); n != 2 || c.deltas.items[0].Text != strings.Repeat("ab", 100) {
			t.Fatalf("%d items: %+v", n, c.deltas.items)
		}
	})
	t.Run("a backed-up send queue drops deltas, never records", func(t *testing.T) {
		c := testClient()
		c.pushDelta(d(1, "content", "first "))
		for range deltaBackoff {
			c.queue <- []byte(`{"type":"records"}`)
		}
		c.pushDelta(d(1, "content", "lost"))
		c.pushDelta(d(1, "content", "lost too"))
		c.pushDelta(d(2, "content", "also lost"))
		if len(c.queue) != deltaBackoff {
			t.Fatalf("the send queue holds %d messages", len(c.queue))
		}
		// The writer catches up; step 1 stays cut until its end, step 2 too.
		for range deltaBackoff {
			<-c.queue
		}
		c.pushDelta(d(1, "content", "after the gap"))
		c.pushDelta(d(1, "end", ""))
		c.pushDelta(d(3, "content", "a new step streams"))
		var kinds []string
		for _, it := range c.deltas.items {
			kinds = append(kinds, it.Kind+":"+it.Text)
		}
		want := "content:first |gap:|gap:|end:|content:a new step streams"
		if strings.Join(kinds, "|") != want {
			t.Fatalf("pending %q, want %q", strings.Join(kinds, "|"), want)
		}
		if c.deltas.dropped != 4 {
			t.Fatalf("%d dropped, want 4", c.deltas.dropped)
		}
	})
	t.Run("bounded in bytes", func(t *testing.T) {
		c := testClient()
		big := strings.Repeat("x", 1<<10)
		for range 200 {
			c.pushDelta(d(1, "content", big))
		}
		if c.deltas.bytes > MaxDeltaBytes {
			t.Fatalf("%d bytes pending, at most %d", c.deltas.bytes, MaxDeltaBytes)
		}
		last := c.deltas.items[len(c.deltas.items)-1]
		if last.Kind != DeltaGap || c.deltas.dropped == 0 {
			t.Fatalf("no gap after the bound: %+v", last)
		}
		if b := c.takeDeltas(); len(b) > MaxDeltaBytes+1024 || c.takeDeltas() != nil {
			t.Fatalf("a delta message of %d bytes, or a second one", len(b))
		}
	})
}

// A client that reads slowly while a step streams megabytes of deltas gets
// every record, and only as many deltas as it has room for: the rest are
// dropped for it (its preview shows a gap), the publisher never waits, and
// the client is not disconnected.
func TestDeltasAreDroppedForASlowReader(t *testing.T) {
	h := start(t)
	h.srv.browser.writeTimeout = 2 * time.Second
	slow := h.helloSmallBuffer(t, 0)
	if m := readMsg(t, slow, 5*time.Second); m.Type != MsgRecords {
		t.Fatalf("first message %+v", m)
	}
	h.waitSubscribed(t, slow)

	const pieces, pieceBytes, batches = 5000, 4 << 10, 10
	published := make(chan time.Duration, 1)
	go func() {
		piece := strings.Repeat("y", pieceBytes)
		var blocked time.Duration
		for i := range pieces {
			t0 := time.Now()
			h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 1, Kind: "content", Text: piece})
			blocked = max(blocked, time.Since(t0))
			if i%50 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		published <- blocked
	}()
	for i := range batches {
		h.admitN(t, 1, "r"+itoa(i), 1<<10)
		time.Sleep(50 * time.Millisecond)
	}
	blocked := <-published

	records, deltaBytes, gaps := 0, 0, 0
	for records < batches {
		time.Sleep(20 * time.Millisecond) // a slow reader
		m := readMsg(t, slow, 5*time.Second)
		records += len(m.Records)
		for _, d := range m.Deltas {
			deltaBytes += len(d.Text)
			if d.Kind == DeltaGap {
				gaps++
			}
		}
	}
	t.Logf("the slow reader got %d records, %d KiB of %d KiB of deltas, %d gap(s); the publisher waited at most %v",
		records, deltaBytes>>10, pieces*pieceBytes>>10, gaps, blocked)
	if gaps == 0 || deltaBytes >= pieces*pieceBytes/2 {
		t.Errorf("deltas were not dropped for a slow reader: %d bytes, %d gaps", deltaBytes, gaps)
	}
	if blocked > 100*time.Millisecond {
		t.Errorf("a publish waited %v", blocked)
	}
	if n := h.srv.browser.slowDrops.Load(); n != 0 {
		t.Fatalf("%d clients dropped; log:\n%s", n, h.logs.String())
	}
}

// clientGoroutines returns the stacks of goroutines of this package's
// sockets (serve, the writer, the reader, the delta forwarder, controls).
func clientGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/web.(*client)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// Every goroutine of a socket ends with it: a closed client, a client
// dropped for being slow, and the clients of a daemon that closes.
func TestSocketsLeaveNoGoroutines(t *testing.T) {
	h := start(t)
	h.srv.browser.writeTimeout = 300 * time.Millisecond
	h.shrinkNextSendBuffer(t, 16<<10)
	slow := h.helloSmallBuffer(t, 0)
	readMsg(t, slow, 5*time.Second)
	a := h.hello(t, 0)
	collect(t, a)
	h.waitSubscribed(t, a)
	b := h.hello(t, 0)
	collect(t, b)
	for i := range 10 {
		h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 1, Kind: "content", Text: "x"})
		h.admitN(t, 5, "g"+itoa(i), 60<<10)
	}
	a.Close(websocket.StatusNormalClosure, "")
	deadline := time.Now().Add(5 * time.Second)
	for h.srv.browser.slowDrops.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slow client was not dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(h.daemon.closing) // b is told the daemon goes away
	for {
		if _, err := tryRead(b, 5*time.Second); err != nil {
			break
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		left := clientGoroutines()
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket goroutines left:\n%s", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Deltas the hub dropped for a slow subscriber show as a gap: the next
// delta's index skips, and the step's preview stops there.
func TestSkippedIndexIsAGap(t *testing.T) {
	h := start(t)
	c := h.hello(t, 0)
	collect(t, c)
	h.waitSubscribed(t, c)
	for _, i := range []int64{0, 1, 4, 5} {
		h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 1, Kind: "content", Text: fmt.Sprintf("<%d>", i), Index: i})
	}
	h.deltas.Publish(live.Delta{Session: "default", Attempt: 1, Step: 1, Kind: "end", Index: 6})
	var got []string
	for len(got) == 0 || got[len(got)-1] != "end" {
		for _, d := range readDeltas(t, c, 1) {
			got = append(got, d.Kind+d.Text)
		}
	}
	if strings.Join(got, " ") != "content<0><1> gap end" && strings.Join(got, " ") != "content<0> content<1> gap end" {
		t.Fatalf("deltas: %q", got)
	}
}
