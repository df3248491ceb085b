package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// Held sends in the operator's DM. With [discord] operator_user_id and
// notify_held, klbr-core hands the transport each held effect once; the
// transport DMs the operator (POST /users/@me/channels, then a message with
// a Release and a Drop button: message components) and reports the notice.
// A press arrives as INTERACTION_CREATE. Discord wants an answer within 3
// seconds: a press by anyone but the operator is answered at once with a
// message only they see, and nothing is decided; the operator's is
// acknowledged first (a deferred update), then decided by klbr-core (which
// checks the user against its own configuration), then the DM is edited to
// say what happened, its buttons removed. A press whose acknowledgement
// Discord refuses (the 3 seconds passed: the operator saw "interaction
// failed") decides nothing: the operator presses again.

// customIDPrefix marks klbr's buttons: "klbr:release:42", "klbr:drop:42".
const customIDPrefix = "klbr:"

var customIDRE = regexp.MustCompile(`^klbr:(release|drop):([1-9][0-9]{0,18})$`)

// MaxInteractionTokenBytes bounds an interaction token (it goes into a URL path).
const MaxInteractionTokenBytes = 1024

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9._:-]+$`)

// Interaction is the part of an INTERACTION_CREATE the transport uses.
type Interaction struct {
	ID, AppID, Token string
	Type             int
	UserID           string // the presser: "user" in a DM, "member.user" in a guild
	CustomID         string
	ChannelID        string
	MessageID        string
	MessageContent   string // the pressed message's text
}

// interactionComponent is Discord's MESSAGE_COMPONENT interaction type.
const interactionComponent = 3

// ParseInteraction decodes an INTERACTION_CREATE's data.
func ParseInteraction(data []byte) (Interaction, error) {
	var ix Interaction
	if len(data) > MaxEventBytes {
		return ix, fmt.Errorf("interaction is %d bytes, at most %d", len(data), MaxEventBytes)
	}
	var w struct {
		ID            string `json:"id"`
		ApplicationID string `json:"application_id"`
		Type          int    `json:"type"`
		Token         string `json:"token"`
		ChannelID     string `json:"channel_id"`
		User          *struct {
			ID string `json:"id"`
		} `json:"user"`
		Member *struct {
			User struct {
				ID string `json:"id"`
			} `json:"user"`
		} `json:"member"`
		Data struct {
			CustomID string `json:"custom_id"`
		} `json:"data"`
		Message *struct {
			ID      string `json:"id"`
			Content string `json:"content"`
		} `json:"message"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&w); err != nil {
		return ix, fmt.Errorf("malformed interaction: %w", err)
	}
	ix = Interaction{ID: w.ID, AppID: w.ApplicationID, Token: w.Token, Type: w.Type, CustomID: w.Data.CustomID, ChannelID: w.ChannelID}
	switch {
	case w.User != nil:
		ix.UserID = w.User.ID
	case w.Member != nil:
		ix.UserID = w.Member.User.ID
	}
	if w.Message != nil {
		ix.MessageID = w.Message.ID
		ix.MessageContent = clipBytes(w.Message.Content, 4*ingressapi.MaxSendChars)
	}
	if !snowflake(ix.ID) || !snowflake(ix.AppID) || !snowflake(ix.UserID) {
		return Interaction{}, errors.New("interaction: id, application_id or the user's id is not a Discord id")
	}
	if len(ix.Token) > MaxInteractionTokenBytes || !tokenRE.MatchString(ix.Token) {
		return Interaction{}, errors.New("interaction: the token is not a token")
	}
	if len(ix.CustomID) > 100 || !utf8.ValidString(ix.CustomID) {
		return Interaction{}, errors.New("interaction: custom_id is over 100 bytes")
	}
	return ix, nil
}

// notifyHeld DMs the operator about a held effect and reports the notice.
func (t *transport) notifyHeld(ctx context.Context, n ingressapi.HeldNotify) {
	var res ingressapi.HeldNotified
	id, err := t.postNotice(ctx, n)
	if err != nil {
		res.Error = "the DM to the operator failed: " + classify(err).Error()
		t.log.Warn("held: the operator's DM failed; klbr-core held lists the effect", "effect", n.ID, "error", res.Error)
	} else {
		res.MessageID = id
	}
	if err := t.retry(ctx, func() error { return t.core.HeldNotified(ctx, n.ID, res) }); err != nil {
		t.log.Warn("held: the notice's outcome was not recorded; it may be sent again", "effect", n.ID, "error", err)
	}
}

// dmChannels caches the DM channel opened with each user.
type dmChannels struct {
	mu sync.Mutex
	by map[string]string
}

func (t *transport) dmChannel(user string) (string, error) {
	t.dms.mu.Lock()
	defer t.dms.mu.Unlock()
	if ch, ok := t.dms.by[user]; ok {
		return ch, nil
	}
	body, err := t.rest.RequestWithBucketID(http.MethodPost, discordgo.EndpointUserChannels("@me"), map[string]string{"recipient_id": user},
		discordgo.EndpointUserChannels("@me"), discordgo.WithRetryOnRatelimit(true))
	if err != nil {
		return "", err
	}
	var ch struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &ch); err != nil || !snowflake(ch.ID) {
		return "", fmt.Errorf("opening a DM: the answer has no channel id: %v", err)
	}
	if t.dms.by == nil {
		t.dms.by = map[string]string{}
	}
	t.dms.by[user] = ch.ID
	return ch.ID, nil
}

// noticeBody is the DM: what is held, why, and what ends the wait.
type noticeBody struct {
	Content         string          `json:"content"`
	Nonce           string          `json:"nonce,omitempty"`
	EnforceNonce    bool            `json:"enforce_nonce,omitempty"`
	AllowedMentions allowedMentions `json:"allowed_mentions"`
	Components      []actionRow     `json:"components"`
}

type actionRow struct {
	Type       int      `json:"type"` // 1
	Components []button `json:"components"`
}

type button struct {
	Type     int    `json:"type"`  // 2
	Style    int    `json:"style"` // 3 success, 4 danger
	Label    string `json:"label"`
	CustomID string `json:"custom_id"`
}

func (t *transport) postNotice(ctx context.Context, n ingressapi.HeldNotify) (string, error) {
	ch, err := t.dmChannel(n.Operator)
	if err != nil {
		return "", err
	}
	id := strconv.FormatInt(n.ID, 10)
	what := "a send"
	quoted := n.Text
	if n.Kind == "react" {
		what, quoted = "a reaction", n.Emoji+" on message "+n.Target
	}
	quoted = clipChars(quoted, 1200)
	content := fmt.Sprintf("**klbr held %s** in %s (effect %s): %s\n> %s\n"+
		"Release sends it now, once; Drop refuses it for good. Or: `klbr-core release %s` / `klbr-core drop %s`.",
		what, n.Conversation, id, clipChars(n.Reason, 300), strings.ReplaceAll(quoted, "\n", "\n> "), id, id)
	body := noticeBody{Content: clipChars(content, ingressapi.MaxSendChars), AllowedMentions: allowedMentions{Parse: []string{}},
		Components: []actionRow{{Type: 1, Components: []button{
			{Type: 2, Style: 3, Label: "Release", CustomID: customIDPrefix + "release:" + id},
			{Type: 2, Style: 4, Label: "Drop", CustomID: customIDPrefix + "drop:" + id}}}}}
	if len(n.Nonce) > 1 { // its own nonce, derived from the effect's: a repeat is answered with the first DM
		body.Nonce, body.EnforceNonce = clipBytes("h"+n.Nonce[1:], 25), true
	}
	ep := discordgo.EndpointChannelMessages(ch)
	resp, err := t.rest.RequestWithBucketID(http.MethodPost, ep, body, ep, discordgo.WithContext(ctx), discordgo.WithRetryOnRatelimit(true))
	if err != nil {
		return "", err
	}
	var m struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(resp, &m); err != nil || !snowflake(m.ID) {
		return "", fmt.Errorf("the DM's answer has no message id: %v", err)
	}
	return m.ID, nil
}

// clipChars cuts s to at most n code points, marking the cut.
func clipChars(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n-1 {
			return s[:j] + "…"
		}
		i++
	}
	return s
}

// onInteraction runs on the gateway's goroutine: the press is answered on
// its own, so a slow answer never holds the gateway.
func (t *transport) onInteraction(ix Interaction) {
	if ix.Type != interactionComponent {
		return
	}
	t.wg.Go(func() { t.press(t.ctx, ix) })
}

// interactionResponse is an interaction callback's body.
type interactionResponse struct {
	Type int                      `json:"type"`
	Data *interactionResponseData `json:"data,omitempty"`
}

type interactionResponseData struct {
	Content         string          `json:"content,omitempty"`
	Flags           int             `json:"flags,omitempty"` // 64: only the presser sees it
	AllowedMentions allowedMentions `json:"allowed_mentions"`
}

// press handles a button press.
func (t *transport) press(ctx context.Context, ix Interaction) {
	m := customIDRE.FindStringSubmatch(ix.CustomID)
	if m == nil || t.cfg.Operator == "" || ix.UserID != t.cfg.Operator {
		why := "Only klbr's operator can release or drop held sends: nothing was done."
		if m == nil {
			why = "This button is not one of klbr's: nothing was done."
		}
		t.log.Warn("held: a button press refused", "user", ix.UserID, "custom_id", clipBytes(ix.CustomID, 100))
		if err := t.respond(ctx, ix, interactionResponse{Type: 4, Data: &interactionResponseData{Content: why, Flags: 64,
			AllowedMentions: allowedMentions{Parse: []string{}}}}); err != nil {
			t.log.Warn("held: answering a refused press", "error", classify(err).Error())
		}
		return
	}
	decision, id := m[1], m[2]
	effect, _ := strconv.ParseInt(id, 10, 64)
	// Acknowledge within Discord's 3 seconds, before anything is decided.
	if err := t.respond(ctx, ix, interactionResponse{Type: 6}); err != nil {
		t.log.Warn("held: the operator's press could not be acknowledged (Discord allows 3 seconds); nothing was decided: press again, or klbr-core "+decision+" "+id,
			"effect", effect, "error", classify(err).Error())
		return
	}
	var out string
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var decided ingressapi.HeldDecided
	err := t.retry(dctx, func() (err error) {
		decided, err = t.core.DecideHeld(dctx, effect, ingressapi.HeldDecision{Decision: decision, UserID: ix.UserID})
		return err
	})
	var se *ingressapi.StatusError
	switch {
	case err == nil && decision == "release":
		out = fmt.Sprintf("✅ **Released** by you: effect %s goes out now, once; its receipt names the release.", id)
	case err == nil:
		out = fmt.Sprintf("🗑️ **Dropped** by you: effect %s never goes out.", id)
	case errors.As(err, &se) && (se.Status == http.StatusConflict || se.Status == http.StatusNotFound):
		out = fmt.Sprintf("Nothing changed: %s", clipChars(se.Message, 300))
	default:
		out = fmt.Sprintf("⚠️ klbr-core did not decide (%s): `klbr-core %s %s` does it.", clipChars(err.Error(), 300), decision, id)
	}
	t.log.Info("held: the operator decided from Discord", "effect", effect, "decision", decision, "state", decided.State, "error", err)
	content := clipChars(ix.MessageContent, ingressapi.MaxSendChars-utf8.RuneCountInString(out)-2) + "\n\n" + out
	body := map[string]any{"content": clipChars(content, ingressapi.MaxSendChars), "components": []actionRow{},
		"allowed_mentions": allowedMentions{Parse: []string{}}}
	ep := discordgo.EndpointInteractionResponseActions(ix.AppID, ix.Token)
	if _, err := t.rest.RequestWithBucketID(http.MethodPatch, ep, body, discordgo.EndpointWebhookToken(ix.AppID, ""), discordgo.WithContext(ctx),
		discordgo.WithRetryOnRatelimit(true)); err != nil {
		t.log.Warn("held: editing the DM after the decision", "effect", effect, "error", classify(err).Error())
	}
}

// respond answers an interaction (POST /interactions/{id}/{token}/callback).
func (t *transport) respond(ctx context.Context, ix Interaction, r interactionResponse) error {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ep := discordgo.EndpointInteractionResponse(ix.ID, ix.Token)
	_, err := t.rest.RequestWithBucketID(http.MethodPost, ep, r, discordgo.EndpointAPI+"interactions", discordgo.WithContext(rctx),
		discordgo.WithRetryOnRatelimit(false))
	return err
}
