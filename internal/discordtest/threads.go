package discordtest

import (
	"encoding/json"
	"net/http"
	"slices"
	"sort"
)

// Threads and forum posts, as Discord has them: a new thread is announced
// with THREAD_CREATE (newly_created, no member object: the bot is not in
// it), and the bot receives no MESSAGE_CREATE in a thread it is not a member
// of until it joins (PUT /channels/{id}/thread-members/@me). That is the
// failure OpenClaw #7918 describes: no events from a new thread until a
// restart. Joining an archived thread is refused (50083).

type thread struct {
	parent, guild string
	archived      bool
	joined        bool
	joins         int
}

// Channel types of the threads and parents the fake makes.
const (
	TypeGuildText       = 0
	TypeGuildForum      = 15
	TypePublicThread    = 11
	TypePrivateThread   = 12
	TypeAnnouncementThr = 10
)

// CreateThread makes a public thread (or, when forum, a forum post) id
// under parent in guild and dispatches its THREAD_CREATE. A forum post's
// opening message is posted in it at once (into its history; the bot, not a
// member yet, is not sent it).
func (f *Fake) CreateThread(id, parent, guild string, forum bool, opening map[string]any) bool {
	f.mu.Lock()
	f.threads[id] = &thread{parent: parent, guild: guild}
	f.mu.Unlock()
	parentType := TypeGuildText
	if forum {
		parentType = TypeGuildForum
	}
	ok := f.Dispatch("THREAD_CREATE", map[string]any{"id": id, "guild_id": guild, "parent_id": parent, "type": TypePublicThread,
		"name": "thread " + id, "newly_created": true, "parent_type": parentType, "owner_id": "5", "message_count": 0, "member_count": 1,
		"thread_metadata": map[string]any{"archived": false, "auto_archive_duration": 1440, "locked": false,
			"archive_timestamp": "2024-01-01T00:00:00Z"}})
	if opening != nil {
		f.Dispatch("MESSAGE_CREATE", opening)
	}
	return ok
}

// ArchiveThread archives a thread: joining it is refused from now on.
func (f *Fake) ArchiveThread(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if th := f.threads[id]; th != nil {
		th.archived = true
	}
}

// ThreadJoins says how many times the bot joined thread id.
func (f *Fake) ThreadJoins(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if th := f.threads[id]; th != nil {
		return th.joins
	}
	return 0
}

// subscribedLocked reports whether the bot receives a dispatch: not a
// message in a thread it has not joined.
func (f *Fake) subscribedLocked(event string, data any) bool {
	if event != "MESSAGE_CREATE" {
		return true
	}
	m, ok := data.(map[string]any)
	if !ok {
		return true
	}
	ch, _ := m["channel_id"].(string)
	th := f.threads[ch]
	return th == nil || th.joined
}

func (f *Fake) joinThread(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	th := f.threads[r.PathValue("ch")]
	switch {
	case th == nil:
		f.mu.Unlock()
		jsonError(w, 404, 10003, "Unknown Channel")
		return
	case th.archived:
		f.mu.Unlock()
		jsonError(w, 400, 50083, "Thread is archived")
		return
	}
	th.joined = true
	th.joins++
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// AddGuild makes the bot a member of guild id: READY lists it (as Discord
// does, an unavailable guild object; GUILD_CREATE follows on Discord, and
// is not needed here).
func (f *Fake) AddGuild(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.guilds = append(f.guilds, id)
}

func (f *Fake) readyGuildsLocked() []any {
	out := []any{}
	for _, g := range f.guilds {
		out = append(out, map[string]any{"id": g, "unavailable": true})
	}
	return out
}

// AddThread makes a thread that exists without a THREAD_CREATE the bot
// saw: one made while klbr-discord was not running. The bot is not a
// member of it; archived threads are left out of the active list.
func (f *Fake) AddThread(id, parent, guild string, archived bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.threads[id] = &thread{parent: parent, guild: guild, archived: archived}
}

// activeThreads is GET /guilds/{guild.id}/threads/active: every active
// (unarchived) thread of the guild, newest (highest id) first, as channel
// objects, and a thread member object for each the bot has joined.
func (f *Fake) activeThreads(w http.ResponseWriter, r *http.Request) {
	guild := r.PathValue("guild")
	f.mu.Lock()
	known := slices.Contains(f.guilds, guild)
	var ids []string
	for id, th := range f.threads {
		if th.guild == guild && !th.archived {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return len(ids[i]) > len(ids[j]) || len(ids[i]) == len(ids[j]) && ids[i] > ids[j] })
	threads, members := []any{}, []any{}
	for _, id := range ids {
		th := f.threads[id]
		threads = append(threads, map[string]any{"id": id, "guild_id": guild, "parent_id": th.parent, "type": TypePublicThread,
			"name": "thread " + id, "owner_id": "5", "message_count": 0, "member_count": 1, "rate_limit_per_user": 0, "flags": 0,
			"thread_metadata": map[string]any{"archived": false, "auto_archive_duration": 1440, "locked": false,
				"archive_timestamp": "2024-01-01T00:00:00Z", "create_timestamp": "2024-01-01T00:00:00Z"}})
		if th.joined {
			members = append(members, map[string]any{"id": id, "user_id": f.BotID, "join_timestamp": "2024-01-01T00:00:00Z", "flags": 0})
		}
	}
	f.mu.Unlock()
	if !known {
		jsonError(w, 404, 10004, "Unknown Guild")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"threads": threads, "members": members})
}
