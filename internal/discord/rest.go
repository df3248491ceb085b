package discord

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// MaxResponseBytes bounds one REST answer.
const MaxResponseBytes = 8 << 20

// rewriter sends discordgo's requests, which name Discord's v9 API, to the
// configured api_base (Discord itself, a compatible server, or a test's
// fake), and bounds what is read back.
type rewriter struct {
	base   *url.URL
	next   http.RoundTripper
	budget *invalidBudget
}

func (rw *rewriter) RoundTrip(req *http.Request) (*http.Response, error) {
	if !rw.budget.allow(!isNonEssential(req.Context())) {
		return nil, ErrInvalidBudget
	}
	u := req.URL.String()
	if rest, ok := strings.CutPrefix(u, discordgo.EndpointAPI); ok {
		nu, err := url.Parse(strings.TrimSuffix(rw.base.String(), "/") + "/" + rest)
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.URL, req.Host = nu, nu.Host
	}
	resp, err := rw.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	rw.budget.record(resp)
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, MaxResponseBytes), resp.Body}
	return resp, nil
}

// newSession is a discordgo session for REST whose requests go to apiBase.
// Its token never leaves the Authorization header.
func newSession(token, apiBase string, budget *invalidBudget) (*discordgo.Session, error) {
	base, err := url.Parse(apiBase)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("discord.api_base %q is not an http(s) URL", apiBase)
	}
	s, err := discordgo.New("Bot " + token)
	if err != nil {
		return nil, err
	}
	s.Client = &http.Client{Timeout: 20 * time.Second, Transport: &rewriter{base: base, next: http.DefaultTransport, budget: budget}}
	s.ShouldRetryOnRateLimit = false // we bound the retries ourselves
	s.MaxRestRetries = 0
	s.LogLevel = discordgo.LogError
	return s, nil
}

// sendBody is POST /channels/{id}/messages with the fields discordgo's
// MessageSend lacks: nonce and enforce_nonce.
type sendBody struct {
	Content          string            `json:"content"`
	Nonce            string            `json:"nonce"`
	EnforceNonce     bool              `json:"enforce_nonce"`
	MessageReference *messageReference `json:"message_reference,omitempty"`
	AllowedMentions  allowedMentions   `json:"allowed_mentions"`
}

type messageReference struct {
	MessageID       string `json:"message_id"`
	FailIfNotExists bool   `json:"fail_if_not_exists"`
}

type allowedMentions struct {
	Parse       []string `json:"parse"`
	RepliedUser bool     `json:"replied_user"`
}

// attemptError classifies a failed REST attempt.
type attemptError struct {
	// definitive: Discord refused (4xx): nothing was delivered.
	// rateLimited: 429, answered before anything happened: retry after RetryAfter.
	// otherwise ambiguous: the request may or may not have taken effect.
	definitive  bool
	rateLimited bool
	retryAfter  time.Duration
	code        string
	msg         string
}

func (e *attemptError) Error() string { return e.code + ": " + e.msg }

func classify(err error) *attemptError {
	if errors.Is(err, ErrInvalidBudget) { // refused here: nothing reached Discord
		return &attemptError{definitive: true, code: "invalid_request_budget", msg: ErrInvalidBudget.Error()}
	}
	var rl *discordgo.RateLimitError
	if errors.As(err, &rl) {
		return &attemptError{rateLimited: true, retryAfter: rl.RetryAfter, code: "http_429", msg: "rate limited"}
	}
	var re *discordgo.RESTError
	if errors.As(err, &re) && re.Response != nil {
		st := re.Response.StatusCode
		msg := http.StatusText(st)
		if re.Message != nil && re.Message.Message != "" {
			msg = re.Message.Message
		}
		if fe := formErrors(re.ResponseBody); fe != "" {
			msg += ": " + fe
		}
		code := "http_" + strconv.Itoa(st)
		if st >= 400 && st < 500 {
			return &attemptError{definitive: true, code: code, msg: clipBytes(msg, 512)}
		}
		return &attemptError{code: code, msg: clipBytes(msg, 512)}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return &attemptError{code: "network", msg: clipBytes(err.Error(), 512)}
	}
	return &attemptError{code: "transport", msg: clipBytes(err.Error(), 512)}
}

// maxFormErrors bounds the field errors read from one refusal.
const maxFormErrors = 8

// formErrors renders the field errors of Discord's invalid form body (code
// 50035): {"errors": {"content": {"_errors": [{"code", "message"}]}}}, nested
// by field path, as "content: Must be 2000 or fewer in length.". Anything
// else renders as "".
func formErrors(body []byte) string {
	if len(body) == 0 || len(body) > 64<<10 {
		return ""
	}
	var r struct {
		Code   int             `json:"code"`
		Errors json.RawMessage `json:"errors"`
	}
	if json.Unmarshal(body, &r) != nil || r.Code != 50035 || len(r.Errors) == 0 {
		return ""
	}
	var out []string
	var walk func(path string, raw json.RawMessage, depth int)
	walk = func(path string, raw json.RawMessage, depth int) {
		var node map[string]json.RawMessage
		if depth > 6 || len(out) >= maxFormErrors || json.Unmarshal(raw, &node) != nil {
			return
		}
		if errs, ok := node["_errors"]; ok {
			var es []struct {
				Message string `json:"message"`
			}
			json.Unmarshal(errs, &es)
			for _, e := range es {
				if len(out) < maxFormErrors {
					out = append(out, clipBytes(path+": "+e.Message, 256))
				}
			}
		}
		keys := make([]string, 0, len(node))
		for k := range node {
			if k != "_errors" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			walk(p, node[k], depth+1)
		}
	}
	walk("", r.Errors, 0)
	return strings.Join(out, "; ")
}

// send posts one message with its stable nonce. With enforce_nonce Discord
// answers a repeat of the nonce (within minutes) with the message it already
// created, so a retry of an ambiguous attempt cannot post twice.
func send(s *discordgo.Session, e ingressapi.Effect) (string, error) {
	body := messageBody(e)
	ep := discordgo.EndpointChannelMessages(e.ChannelID)
	resp, err := s.RequestWithBucketID(http.MethodPost, ep, body, ep, discordgo.WithRetryOnRatelimit(false))
	if err != nil {
		return "", err
	}
	var m struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(resp, &m); err != nil || !snowflake(m.ID) {
		return "", fmt.Errorf("the send's answer has no message id: %v", err)
	}
	return m.ID, nil
}

// messageBody is the JSON body of e's message.
func messageBody(e ingressapi.Effect) sendBody {
	body := sendBody{Content: e.Text, Nonce: e.Nonce, EnforceNonce: true,
		AllowedMentions: allowedMentions{Parse: []string{"users"}, RepliedUser: true}}
	if e.ReplyReference && e.Target != "" {
		body.MessageReference = &messageReference{MessageID: e.Target}
	}
	return body
}

// react adds our reaction; emoji is a Unicode emoji or name:id.
func react(s *discordgo.Session, e ingressapi.Effect) error {
	return s.MessageReactionAdd(e.ChannelID, e.Target, url.PathEscape(e.Emoji), discordgo.WithRetryOnRatelimit(false))
}

// historyRaw reads up to limit messages of a channel as Discord answers
// them (newest first).
func historyRaw(s *discordgo.Session, channel string, limit int, before, after string, opts ...discordgo.RequestOption) ([]json.RawMessage, error) {
	v := url.Values{}
	v.Set("limit", strconv.Itoa(limit))
	if before != "" {
		v.Set("before", before)
	}
	if after != "" {
		v.Set("after", after)
	}
	ep := discordgo.EndpointChannelMessages(channel) + "?" + v.Encode()
	resp, err := s.RequestWithBucketID(http.MethodGet, ep, nil, discordgo.EndpointChannelMessages(channel), append([]discordgo.RequestOption{discordgo.WithRetryOnRatelimit(true)}, opts...)...)
	if err != nil {
		return nil, err
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(resp, &raw); err != nil {
		return nil, fmt.Errorf("history: malformed answer: %w", err)
	}
	if len(raw) > ingressapi.MaxReadLimit {
		raw = raw[:ingressapi.MaxReadLimit]
	}
	return raw, nil
}

// history reads up to limit messages of a channel (newest first, as
// Discord answers), with their nonces where the API reports them.
func history(s *discordgo.Session, channel string, limit int, before, after string) ([]ingressapi.HistoryMessage, error) {
	raw, err := historyRaw(s, channel, limit, before, after)
	if err != nil {
		return nil, err
	}
	out := make([]ingressapi.HistoryMessage, 0, len(raw))
	for _, r := range raw {
		var w wireMessage
		if json.Unmarshal(r, &w) != nil || !snowflake(w.ID) {
			continue
		}
		h := ingressapi.HistoryMessage{MessageID: w.ID, AuthorID: w.Author.ID, AuthorName: clipBytes(firstOf(w.Author.GlobalName, w.Author.Username), ingressapi.MaxNameBytes),
			Bot: w.Author.Bot, Content: clipBytes(w.Content, ingressapi.MaxContentBytes), OccurredAt: w.Timestamp}
		if w.MessageReference != nil && snowflake(w.MessageReference.MessageID) {
			h.ReplyTo = w.MessageReference.MessageID
		}
		var nonce string
		if json.Unmarshal(w.Nonce, &nonce) == nil && len(nonce) <= 25 {
			h.Nonce = nonce
		}
		out = append(out, h)
	}
	return out, nil
}
