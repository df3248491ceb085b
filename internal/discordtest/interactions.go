package discordtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// DMs and message components, as Discord has them: the bot opens a DM
// channel with POST /users/@me/channels {"recipient_id"}; a button press
// arrives as INTERACTION_CREATE (type 3, MESSAGE_COMPONENT; in a DM the
// presser is "user", in a guild "member.user") with a token. The initial
// response (POST /interactions/{id}/{token}/callback) must come within 3
// seconds, once: later, Discord answers 404 Unknown interaction (10062); a
// second one, 400 already acknowledged (40060). The token then edits the
// original message (PATCH /webhooks/{application id}/{token}/messages/@original)
// for 15 minutes; after, 401 Invalid Webhook Token (50027).

// Interaction response types.
const (
	ResponseMessage         = 4 // CHANNEL_MESSAGE_WITH_SOURCE
	ResponseDeferredMessage = 5
	ResponseDeferredUpdate  = 6 // DEFERRED_UPDATE_MESSAGE
	ResponseUpdateMessage   = 7 // UPDATE_MESSAGE
)

// Interaction is a button press and what the bot answered.
type Interaction struct {
	ID, Token, MessageID, ChannelID, UserID, CustomID string
	Created                                           time.Time
	Response                                          int  // the callback's type; 0: none yet
	Ephemeral                                         bool // the callback's message had flag 64
	Content                                           string
	Late                                              int      // callbacks refused as past the window (10062)
	Edits                                             []string // contents PATCHed onto the original
}

type ixState struct {
	dms  map[string]string // recipient → DM channel id
	byID map[string]*Interaction
	// Window is the initial response's window (0: 3 s); TTL the token's
	// life for edits (0: 15 min).
	window, ttl time.Duration
}

// SetInteractionWindows sets the initial response's window and the
// token's life (0: Discord's 3 s and 15 min).
func (f *Fake) SetInteractionWindows(window, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ix.window, f.ix.ttl = window, ttl
}

// DMChannel returns the DM channel the bot opened with user, if any.
func (f *Fake) DMChannel(user string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ix.dms[user]
}

func (f *Fake) openDM(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RecipientID string `json:"recipient_id"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.RecipientID == "" {
		formError(w, "recipient_id", "BASE_TYPE_REQUIRED", "This field is required")
		return
	}
	f.mu.Lock()
	ch, ok := f.ix.dms[body.RecipientID]
	if !ok {
		f.nextID++
		ch = strconv.FormatInt(f.nextID, 10)
		f.ix.dms[body.RecipientID] = ch
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": ch, "type": 1, "last_message_id": nil, "flags": 0,
		"recipients": []any{map[string]any{"id": body.RecipientID, "username": "user" + body.RecipientID, "discriminator": "0"}}})
}

// Press presses the button customID of message messageID as user, age
// ago (a press the gateway delivers late), and dispatches its
// INTERACTION_CREATE. It returns the interaction's id.
func (f *Fake) Press(messageID, customID, user string, age time.Duration) string {
	f.mu.Lock()
	var msg *Sent
	for i := range f.sent {
		if f.sent[i].ID == messageID {
			msg = &f.sent[i]
		}
	}
	if msg == nil {
		f.mu.Unlock()
		panic("discordtest: Press on a message the bot did not send: " + messageID)
	}
	f.nextID++
	ix := &Interaction{ID: strconv.FormatInt(f.nextID, 10), Token: fmt.Sprintf("aW50ZXJhY3Rpb246%d:tok", f.nextID), MessageID: messageID,
		ChannelID: msg.ChannelID, UserID: user, CustomID: customID, Created: time.Now().Add(-age)}
	f.ix.byID[ix.ID] = ix
	data := map[string]any{"id": ix.ID, "application_id": f.BotID, "type": 3, "token": ix.Token, "version": 1,
		"channel_id": msg.ChannelID, "channel": map[string]any{"id": msg.ChannelID, "type": 1},
		"user":    map[string]any{"id": user, "username": "user" + user, "discriminator": "0", "global_name": nil},
		"data":    map[string]any{"custom_id": customID, "component_type": 2},
		"message": f.wire(*msg, false), "locale": "en-US", "app_permissions": "0", "context": 1,
		"authorizing_integration_owners": map[string]any{"0": "1"}, "entitlements": []any{}}
	f.mu.Unlock()
	f.Dispatch("INTERACTION_CREATE", data)
	return ix.ID
}

// Interaction returns what became of interaction id.
func (f *Fake) Interaction(id string) Interaction {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ix := f.ix.byID[id]; ix != nil {
		c := *ix
		c.Edits = append([]string(nil), ix.Edits...)
		return c
	}
	return Interaction{}
}

func (f *Fake) interactionCallback(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Type int `json:"type"`
		Data *struct {
			Content    string          `json:"content"`
			Flags      int             `json:"flags"`
			Components json.RawMessage `json:"components"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
		jsonError(w, 400, 50109, "The request body contains invalid JSON.")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ix := f.ix.byID[r.PathValue("id")]
	window := f.ix.window
	if window == 0 {
		window = 3 * time.Second
	}
	switch {
	case ix == nil || ix.Token != r.PathValue("token"):
		jsonError(w, 404, 10062, "Unknown interaction")
		return
	case ix.Response != 0:
		jsonError(w, 400, 40060, "Interaction has already been acknowledged.")
		return
	case time.Since(ix.Created) > window:
		ix.Late++
		jsonError(w, 404, 10062, "Unknown interaction")
		return
	}
	switch body.Type {
	case ResponseMessage, ResponseDeferredMessage, ResponseDeferredUpdate, ResponseUpdateMessage:
	default:
		formError(w, "type", "BASE_TYPE_CHOICES", fmt.Sprintf("Value must be one of {4, 5, 6, 7, 9, 10, 12}, not %d.", body.Type))
		return
	}
	ix.Response = body.Type
	if body.Data != nil {
		ix.Content = body.Data.Content
		ix.Ephemeral = body.Data.Flags&64 != 0
		if body.Type == ResponseUpdateMessage {
			f.editLocked(ix.MessageID, body.Data.Content, body.Data.Components)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *Fake) editOriginal(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Content    *string         `json:"content"`
		Components json.RawMessage `json:"components"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
		jsonError(w, 400, 50109, "The request body contains invalid JSON.")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var ix *Interaction
	for _, x := range f.ix.byID {
		if x.Token == r.PathValue("token") {
			ix = x
		}
	}
	ttl := f.ix.ttl
	if ttl == 0 {
		ttl = 15 * time.Minute
	}
	switch {
	case ix == nil || r.PathValue("app") != f.BotID || time.Since(ix.Created) > ttl:
		jsonError(w, 401, 50027, "Invalid Webhook Token")
		return
	case ix.Response == 0:
		jsonError(w, 404, 10008, "Unknown Message")
		return
	}
	content := ""
	if body.Content != nil {
		content = *body.Content
	}
	ix.Edits = append(ix.Edits, content)
	s := f.editLocked(ix.MessageID, content, body.Components)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(f.wire(s, false))
}

// editLocked changes a sent message's content and components.
func (f *Fake) editLocked(id, content string, components json.RawMessage) Sent {
	for i := range f.sent {
		if f.sent[i].ID == id {
			if content != "" {
				f.sent[i].Content = content
			}
			if components != nil {
				f.sent[i].Components = components
			}
			return f.sent[i]
		}
	}
	return Sent{}
}
