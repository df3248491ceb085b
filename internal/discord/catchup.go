package discord

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// catchUp reads one page of a channel's history after the message after
// ("": the newest page), and admits what passes the filter, oldest first,
// before it returns: admission dedupes by source key, so a message the
// gateway delivers too is admitted once, and one the flood limiter refused
// live stays refused (its burst's notice names it). Live messages of the
// channel are out of order meanwhile. full says a page was not enough (a
// gap notice is queued). The watch learns the newest id read.
func (t *transport) catchUp(ctx context.Context, c ingressapi.ConversationRef, after string, nonEssentialCall bool, while string) (admitted int, full bool, err error) {
	t.order.begin(c.ChannelID)
	defer t.order.end(c.ChannelID)
	rctx := ctx
	if nonEssentialCall {
		rctx = nonEssential(ctx)
	}
	raw, err := historyRaw(t.rest, c.ChannelID, ingressapi.MaxReadLimit, "", after, discordgo.WithContext(rctx))
	if err != nil {
		return 0, false, err
	}
	cf := t.channels.Load()
	f := Filter{BotID: t.bot(), Channels: cf.Channels, Directed: cf.Directed, IncludeBots: cf.IncludeBots}
	if c.Kind == ingressapi.KindThread {
		f.Threads = map[string]string{c.ChannelID: c.ParentID}
	}
	msgs := make([]ingressapi.Message, 0, len(raw))
	for _, r := range raw {
		var obj map[string]json.RawMessage
		if json.Unmarshal(r, &obj) != nil {
			continue
		}
		var id string
		if json.Unmarshal(obj["id"], &id) == nil && snowflake(id) {
			t.watch.seen(c.ChannelID, id)
		}
		data := r
		if c.GuildID != "" { // history leaves guild_id out
			obj["guild_id"], _ = json.Marshal(c.GuildID)
			data, _ = json.Marshal(obj)
		}
		if m, err := Normalize(data, f); err == nil && !t.flood.refused(m.MessageID) {
			msgs = append(msgs, m)
		}
	}
	sort.Slice(msgs, func(i, j int) bool { return snowflakeLess(msgs[i].MessageID, msgs[j].MessageID) })
	for rest := msgs; len(rest) > 0; {
		n := min(len(rest), ingressapi.MaxBatch)
		t.admit(ctx, rest[:n], false)
		rest = rest[n:]
	}
	if len(raw) == ingressapi.MaxReadLimit && after != "" {
		t.gaps.Add(1)
		t.enqueue(ctx, ingressapi.Message{MessageID: "g" + strconv.FormatInt(time.Now().UnixNano(), 10), Mode: ingressapi.ModeGap,
			Content: fmt.Sprintf("[klbr-discord] more than %d messages arrived in channel %s %s; only the oldest %d were fetched",
				ingressapi.MaxReadLimit, c.ChannelID, while, ingressapi.MaxReadLimit), OccurredAt: time.Now()})
		full = true
	}
	return len(msgs), full, nil
}
