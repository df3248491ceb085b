package discord

import (
	"context"
	"sync"
)

// Threads made while the gateway was not heard. THREAD_CREATE goes to the
// session that is connected; a thread made between a disconnect and a new
// session (the old one could not be resumed), or while a connection was
// deaf, announced itself to nobody, and the bot, not a member, would receive
// none of its messages until the next start. So after such a loss the
// transport lists the guilds' active threads again (the bounded call of
// start, GET /guilds/{id}/threads/active, non-essential under the
// invalid-request budget), joins those under watched channels it is not a
// member of or had never seen, and reads each back after the mark: the
// newest message the transport had seen of any channel when it stopped
// hearing Discord (one page; more is a gap notice). Threads it knew and is a
// member of are left alone. Archived threads are never joined.

// rediscovery holds one pending request to list active threads again;
// requests made while one waits merge into it (the older mark wins).
type rediscovery struct {
	wake chan struct{} // cap 1: a request waits

	mu      sync.Mutex // guards the fields below
	pending bool
	mark    string // read back after this message ("": join only, read nothing)
	while   string // for the gap notice: "while …"
}

func newRediscovery() *rediscovery { return &rediscovery{wake: make(chan struct{}, 1)} }

// request asks for a rediscovery of threads made after mark.
func (r *rediscovery) request(mark, while string) {
	r.mu.Lock()
	if !r.pending || snowflakeLess(mark, r.mark) {
		r.mark, r.while = mark, while
	}
	r.pending = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// take returns the pending request, if any, and clears it.
func (r *rediscovery) take() (mark, while string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mark, while, ok = r.mark, r.while, r.pending
	r.pending, r.mark, r.while = false, "", ""
	return mark, while, ok
}

// knownThread says whether the transport has seen thread id (its
// THREAD_CREATE, or the active list at start).
func (t *transport) knownThread(id string) bool {
	t.parentsMu.Lock()
	defer t.parentsMu.Unlock()
	_, ok := t.filter.Threads[id]
	return ok
}

// rediscoverThreads lists the active threads of READY's guilds again after
// the gateway was not heard, and joins and reads back those made meanwhile.
func (t *transport) rediscoverThreads(ctx context.Context, mark, while string) {
	guilds := t.guilds.Load()
	if guilds == nil {
		return
	}
	var found int
	for _, g := range *guilds {
		if ctx.Err() != nil {
			return
		}
		ths, ok := t.activeThreads(nonEssential(ctx), g, "threads made "+while+" stay unread until their next THREAD_CREATE or the next start")
		if !ok {
			continue
		}
		for _, th := range ths {
			known := t.knownThread(th.ID)
			t.learnParent(th)
			if !t.watchedThread(th) || th.Member && known {
				continue
			}
			found++
			t.joinAndRead(ctx, th, mark, mark != "", while)
		}
	}
	if found > 0 {
		t.log.Info("threads: threads made "+while+" found", "threads", found)
	}
}
