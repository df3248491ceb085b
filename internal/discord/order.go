package discord

import "sync"

// order tracks the channels whose older messages may still be on their way
// to admission: each conversation a hello hands over until its backfill is
// admitted, and any channel while a catch-up of it runs (nothing is admitted
// before the first hello). A live message of such a channel is admitted out of order: it does
// not move the conversation's backfill cursor, so a transport stopped before
// the catch-up's messages were admitted reads them again when it starts.
type order struct {
	mu      sync.Mutex
	pending map[string]int // catch-ups due or running, by channel
}

func newOrder() *order { return &order{pending: map[string]int{}} }

// outOfOrder reports whether a live message of channel ch may overtake an
// older one not yet admitted.
func (o *order) outOfOrder(ch string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pending[ch] > 0
}

// hello begins a catch-up of each channel a hello handed over.
func (o *order) hello(channels []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ch := range channels {
		o.pending[ch]++
	}
}

func (o *order) begin(ch string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pending[ch]++
}

// end ends one catch-up of ch: its messages are admitted.
func (o *order) end(ch string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[ch]--; o.pending[ch] <= 0 {
		delete(o.pending, ch)
	}
}
