package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// Threads that existed before klbr-discord started. THREAD_CREATE only
// announces threads made while the gateway is connected; a thread made while
// klbr-discord was down (or before it joined threads at all) would stay
// silent, and with discord.channels set its messages would not even map to
// their parent. So at start, once the core's hello said what it has, the
// transport asks GET /guilds/{id}/threads/active for each guild READY lists
// (Discord: "all active threads in the guild, including public and private
// threads", with a thread member object for each the bot has joined), records
// every thread's parent, joins those under watched channels it is not a
// member of, and reads back what it has not seen:
//   - a thread the core knows was backfilled after its newest message with
//     every other conversation (backfill); it is only joined if need be;
//   - a thread the core does not know is read after the newest message the
//     core has of any conversation (where the store last saw Discord): what
//     came while nothing was connected. A fresh store (no message at all)
//     reads nothing back.
// Archived threads are not in the active list, and are never joined: the
// agent does not revive one unless it sends there.

// MaxActiveThreadsBytes bounds one GET /guilds/{id}/threads/active answer.
const MaxActiveThreadsBytes = MaxResponseBytes

// maxStartThreads bounds the threads one guild's answer is read for.
const maxStartThreads = 1000

// ParseActiveThreads decodes a GET /guilds/{id}/threads/active answer: the
// threads (each as ParseThreadCreate reads it; one it refuses is left out),
// Member set for those the members list names. At most maxStartThreads.
func ParseActiveThreads(data []byte) ([]ThreadCreate, error) {
	if len(data) > MaxActiveThreadsBytes {
		return nil, fmt.Errorf("active threads answer is %d bytes, at most %d", len(data), MaxActiveThreadsBytes)
	}
	var w struct {
		Threads []json.RawMessage `json:"threads"`
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&w); err != nil {
		return nil, fmt.Errorf("malformed active threads answer: %w", err)
	}
	member := map[string]bool{}
	for _, m := range w.Members {
		if snowflake(m.ID) {
			member[m.ID] = true
		}
	}
	var out []ThreadCreate
	for _, raw := range w.Threads {
		if len(out) == maxStartThreads {
			break
		}
		th, err := ParseThreadCreate(raw)
		if err != nil {
			continue
		}
		th.Member = member[th.ID]
		out = append(out, th)
	}
	return out, nil
}

// discoverThreads finds, joins and reads back the threads that existed
// before start; convs is the core's hello.
func (t *transport) discoverThreads(ctx context.Context, convs []ingressapi.ConversationRef) {
	guilds := t.guilds.Load()
	if guilds == nil {
		return
	}
	known := map[string]bool{}
	var mark string // the newest message the core has of any conversation
	for _, c := range convs {
		known[c.ChannelID] = true
		if snowflake(c.LastMessageID) && snowflakeLess(mark, c.LastMessageID) {
			mark = c.LastMessageID
		}
	}
	var found, joined int
	for _, g := range *guilds {
		if ctx.Err() != nil {
			return
		}
		ths, ok := t.activeThreads(ctx, g, "threads made while klbr-discord was not running stay unread until their next THREAD_CREATE")
		if !ok {
			continue
		}
		for _, th := range ths {
			t.learnParent(th)
			if !t.watchedThread(th) {
				continue
			}
			found++
			if !th.Member {
				joined++
			}
			switch {
			case known[th.ID]: // backfilled with the other conversations
				t.joinAndRead(ctx, th, "", false, "")
			case mark != "":
				t.joinAndRead(ctx, th, mark, true, "while klbr-discord was not running")
			default: // a fresh store: from now on
				t.joinAndRead(ctx, th, "", false, "")
			}
		}
	}
	if found > 0 {
		t.log.Info("threads: active threads under watched channels found at start", "threads", found, "joined", joined)
	}
}

// activeThreads lists guild g's active threads (GET
// /guilds/{id}/threads/active); a failure is logged with what it costs.
func (t *transport) activeThreads(ctx context.Context, g, cost string) ([]ThreadCreate, bool) {
	ep := discordgo.EndpointGuildActiveThreads(g)
	body, err := t.rest.RequestWithBucketID(http.MethodGet, ep, nil, ep, discordgo.WithContext(ctx), discordgo.WithRetryOnRatelimit(true))
	if err != nil {
		t.log.Warn("threads: listing a guild's active threads; "+cost, "guild", g, "error", classify(err).Error())
		return nil, false
	}
	ths, err := ParseActiveThreads(body)
	if err != nil {
		t.log.Warn("threads: listing a guild's active threads", "guild", g, "error", err)
		return nil, false
	}
	return ths, true
}

// watchedThread says whether th is one to join: not archived, under a
// watched channel (any, when the filter names none).
func (t *transport) watchedThread(th ThreadCreate) bool {
	cf := t.channels.Load()
	return !th.Archived && (len(cf.Channels) == 0 || slices.Contains(cf.Channels, th.ParentID))
}
