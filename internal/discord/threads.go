package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// Threads and forum posts. Discord announces a new thread with
// THREAD_CREATE, but a bot that is not a member of it receives none of its
// messages (OpenClaw #7918: no events from new threads until a restart). A
// new thread or forum post under a watched channel is therefore joined
// (PUT /channels/{id}/thread-members/@me) and what it already holds (a forum
// post's opening message, written before the join) is read back and
// admitted, deduplicated like any other delivery. Its messages pass the
// parent channel's filter. An archived thread is never joined: the agent
// does not revive one unless it sends there.

// ThreadCreate is the part of a THREAD_CREATE the transport uses.
type ThreadCreate struct {
	ID, ParentID, GuildID string
	Type                  int
	Archived              bool
	Member                bool // the bot is a member already
	NewlyCreated          bool
}

// Thread channel types: announcement, public and private threads (a forum
// post is a public thread whose parent is a forum or media channel).
var threadTypes = []int{10, 11, 12}

// MaxThreadEventBytes bounds a THREAD_CREATE's data.
const MaxThreadEventBytes = 64 << 10

// ParseThreadCreate decodes a THREAD_CREATE's data.
func ParseThreadCreate(data []byte) (ThreadCreate, error) {
	var th ThreadCreate
	if len(data) > MaxThreadEventBytes {
		return th, fmt.Errorf("thread event is %d bytes, at most %d", len(data), MaxThreadEventBytes)
	}
	var w struct {
		ID             string          `json:"id"`
		ParentID       string          `json:"parent_id"`
		GuildID        string          `json:"guild_id"`
		Type           int             `json:"type"`
		NewlyCreated   bool            `json:"newly_created"`
		Member         json.RawMessage `json:"member"`
		ThreadMetadata *struct {
			Archived bool `json:"archived"`
		} `json:"thread_metadata"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&w); err != nil {
		return th, fmt.Errorf("malformed thread event: %w", err)
	}
	if !snowflake(w.ID) || !snowflake(w.ParentID) || !snowflake(w.GuildID) {
		return th, errors.New("thread event: id, parent_id or guild_id is not a Discord id")
	}
	if !slices.Contains(threadTypes, w.Type) {
		return th, fmt.Errorf("thread event: channel type %d is not a thread", w.Type)
	}
	th = ThreadCreate{ID: w.ID, ParentID: w.ParentID, GuildID: w.GuildID, Type: w.Type, NewlyCreated: w.NewlyCreated,
		Member: len(w.Member) > 0 && !bytes.Equal(w.Member, []byte("null"))}
	if w.ThreadMetadata != nil {
		th.Archived = w.ThreadMetadata.Archived
	}
	return th, nil
}

// maxThreads bounds the threads the transport remembers the parent of.
const maxThreads = 100000

// threadJoinQueue bounds the joins waiting: a burst past it is logged, and
// those threads' messages then arrive only once someone joins them.
const threadJoinQueue = 256

// onThread runs on the gateway's goroutine: it records the thread's parent
// (the filter passes its messages as the parent's) and queues a join.
func (t *transport) onThread(th ThreadCreate) {
	t.takeFilter()
	t.learnParent(th)
	if len(t.filter.Channels) > 0 && !slices.Contains(t.filter.Channels, th.ParentID) {
		return // not under a watched channel
	}
	if th.Archived || th.Member {
		return
	}
	select {
	case t.joins <- th:
	default:
		t.log.Warn("threads: too many joins waiting; this thread's messages are not received until the bot is added to it", "thread", th.ID)
	}
}

// joinLoop joins queued threads one at a time and reads back what they
// already hold, and lists the active threads again after the gateway was
// not heard (threads_lost.go).
func (t *transport) joinLoop(ctx context.Context) {
	for {
		select {
		case th := <-t.joins:
			t.join(ctx, th)
		case <-t.rediscover.wake:
			if mark, while, ok := t.rediscover.take(); ok {
				t.rediscoverThreads(ctx, mark, while)
			}
		case <-ctx.Done():
			return
		}
	}
}

// learnParent records a thread's parent: the filter passes its messages as
// the parent's.
func (t *transport) learnParent(th ThreadCreate) {
	t.parentsMu.Lock()
	defer t.parentsMu.Unlock()
	if len(t.filter.Threads) < maxThreads {
		t.filter.Threads[th.ID] = th.ParentID
	}
}

// join joins a new thread and reads back the newest page it holds.
func (t *transport) join(ctx context.Context, th ThreadCreate) {
	t.joinAndRead(ctx, th, "", true, "")
}

// joinAndRead joins th unless the bot is a member already, then reads back
// what came after the message after ("": the newest page) unless read is
// false.
func (t *transport) joinAndRead(ctx context.Context, th ThreadCreate, after string, read bool, while string) {
	if !th.Member && t.joining(th.ID) {
		if err := t.rest.ThreadJoin(th.ID, discordgo.WithContext(ctx), discordgo.WithRetryOnRatelimit(true)); err != nil {
			t.unjoin(th.ID)
			t.log.Warn("threads: joining a thread failed; its messages are not received", "thread", th.ID, "parent", th.ParentID, "error", classify(err).Error())
			return
		}
		t.threadJoins.Add(1)
	}
	ref := ingressapi.ConversationRef{ChannelID: th.ID, Kind: ingressapi.KindThread, GuildID: th.GuildID, ParentID: th.ParentID}
	t.watch.track(ref, after)
	if !read {
		return
	}
	if _, _, err := t.catchUp(ctx, ref, after, true, while); err != nil {
		t.log.Warn("threads: reading back a joined thread", "thread", th.ID, "error", classify(err).Error())
	}
}

// joining marks thread id joined by this transport and reports whether it
// was not yet: the THREAD_CREATE of a thread and the active list read at
// start (or after a lost session) can both name it, and it is joined once.
func (t *transport) joining(id string) bool {
	t.parentsMu.Lock()
	defer t.parentsMu.Unlock()
	if t.joinedThreads == nil {
		t.joinedThreads = map[string]bool{}
	}
	if t.joinedThreads[id] || len(t.joinedThreads) >= maxThreads {
		return !t.joinedThreads[id] // past the bound: join again rather than never
	}
	t.joinedThreads[id] = true
	return true
}

// unjoin forgets a join that failed.
func (t *transport) unjoin(id string) {
	t.parentsMu.Lock()
	defer t.parentsMu.Unlock()
	delete(t.joinedThreads, id)
}
