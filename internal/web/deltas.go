package web

import (
	"context"
	"encoding/json"

	"github.com/klbr-dev/klbr/internal/live"
)

// Token deltas (docs/browser.md, "Deltas"). They are best-effort and carry
// no cursor: the durable scratchpad record of a step is the truth, and
// the client replaces its preview with it. A client's deltas never wait in
// its send queue: they are coalesced here, written only when no record or
// answer is queued, and dropped, never queued, when the client falls
// behind, so deltas alone never disconnect a client and never delay a
// record.

// Bounds of the deltas pending for one client.
const (
	// MaxDeltaBytes bounds the delta text pending for one client; a delta
	// past it is dropped.
	MaxDeltaBytes = 64 << 10
	// deltaBackoff: with this many messages in the send queue the client is
	// behind, and deltas are dropped rather than kept.
	deltaBackoff = 8
	// maxDeltaItems bounds the pending items (ends and gaps included).
	maxDeltaItems = 1024
	// maxCut bounds the steps remembered as cut.
	maxCut = 64
)

// DeltaGap is the kind of the item that tells the client a step lost
// deltas: its preview is incomplete, and no more of its deltas follow
// (except its end). Its record will replace it.
const DeltaGap = "gap"

// deltaItem is one delta as the client gets it: the socket is for one
// session, so the session is left out.
type deltaItem struct {
	Attempt int64  `json:"attempt"`
	Step    int64  `json:"step"`
	Kind    string `json:"kind"`
	Text    string `json:"text,omitempty"`
	Call    string `json:"call,omitempty"`
	// Index is the step's stream position of the item's first delta: a
	// step whose first item has an index above 0 was joined mid-stream.
	Index int64 `json:"index"`
}

// deltaMsg carries the deltas pending for a client, in order.
type deltaMsg struct {
	Type   string      `json:"type"` // MsgDelta
	Deltas []deltaItem `json:"deltas"`
}

type stepKey struct{ attempt, step int64 }

// deltaQueue is a client's pending deltas (guarded by client.deltaMu).
type deltaQueue struct {
	items   []deltaItem
	bytes   int
	cut     map[stepKey]bool  // steps that lost a delta: the rest is dropped
	next    map[stepKey]int64 // the index each step's next delta should have
	dropped int64             // deltas dropped, over the socket's life
}

// forwardDeltas moves the session's deltas from the hub to the client's
// pending deltas until the socket ends.
func (c *client) forwardDeltas(ctx context.Context, sub <-chan live.Delta) {
	for {
		select {
		case d := <-sub:
			c.pushDelta(d)
		case <-ctx.Done():
			return
		case <-c.done:
			return
		}
	}
}

// pushDelta adds d to the pending deltas, or drops it.
func (c *client) pushDelta(d live.Delta) {
	c.deltaMu.Lock()
	defer c.deltaMu.Unlock()
	q := &c.deltas
	k := stepKey{d.Attempt, d.Step}
	if d.Kind == "end" {
		delete(q.cut, k)
		delete(q.next, k)
		if len(q.items) < maxDeltaItems {
			q.items = append(q.items, deltaItem{Attempt: d.Attempt, Step: d.Step, Kind: d.Kind})
			c.readyDeltas()
		}
		return
	}
	if q.cut[k] {
		q.dropped++
		return
	}
	want, seen := q.next[k]
	if q.next == nil || len(q.next) >= maxCut {
		q.next = map[stepKey]int64{}
	}
	q.next[k] = d.Index + 1
	lost := seen && d.Index > want // the hub dropped deltas for this subscriber
	if lost || len(c.queue) >= deltaBackoff || q.bytes+len(d.Text) > MaxDeltaBytes || len(q.items) >= maxDeltaItems-1 {
		// The client is behind: this step's preview stops here, with a gap
		// item that says so (one item, so it always fits).
		q.dropped++
		if q.cut == nil || len(q.cut) >= maxCut {
			q.cut = map[stepKey]bool{}
		}
		q.cut[k] = true
		q.items = append(q.items, deltaItem{Attempt: d.Attempt, Step: d.Step, Kind: DeltaGap})
		c.readyDeltas()
		return
	}
	if n := len(q.items); n > 0 {
		last := &q.items[n-1]
		if last.Attempt == d.Attempt && last.Step == d.Step && last.Kind == d.Kind && last.Call == d.Call {
			last.Text += d.Text
			q.bytes += len(d.Text)
			c.readyDeltas()
			return
		}
	}
	q.items = append(q.items, deltaItem{Attempt: d.Attempt, Step: d.Step, Kind: d.Kind, Text: d.Text, Call: d.Call, Index: d.Index})
	q.bytes += len(d.Text)
	c.readyDeltas()
}

// readyDeltas wakes the writer (deltaMu held).
func (c *client) readyDeltas() {
	select {
	case c.deltaReady <- struct{}{}:
	default:
	}
}

// takeDeltas returns the pending deltas as one message, or nil.
func (c *client) takeDeltas() []byte {
	c.deltaMu.Lock()
	items := c.deltas.items
	c.deltas.items, c.deltas.bytes = nil, 0
	c.deltaMu.Unlock()
	if len(items) == 0 {
		return nil
	}
	b, err := json.Marshal(deltaMsg{Type: MsgDelta, Deltas: items})
	if err != nil {
		c.b.log.Error("browser: encode deltas", "error", err)
		return nil
	}
	return b
}
