// Package provider talks to one OpenAI-compatible /chat/completions route:
// request bodies with the route's declared cache fields, streaming (SSE) and
// non-streaming responses, tool calls, reasoning kept apart from content,
// and usage reported as the provider reported it, never inferred.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/secretfile"
)

// Bounds of a response.
const (
	// DefaultMaxBody bounds a non-streaming response body.
	DefaultMaxBody = 16 << 20
	// maxErrorBody bounds how much of an error response is read.
	maxErrorBody = 64 << 10
)

// Options are the dependencies of a Client. Every field is optional.
type Options struct {
	// HTTPClient sends requests; nil means a client of its own with the
	// default transport. Its Timeout should be 0: the route's
	// timeout_seconds is applied per request.
	HTTPClient *http.Client
	// LookupEnv finds api_key_env; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// ReadFile reads api_key_file; nil means secretfile.Read with
	// MaxKeyFileBytes (a regular file only, opened without blocking).
	ReadFile func(string) ([]byte, error)
	// Logger; nil discards. The API key is never logged.
	Logger *slog.Logger
	// MaxSSELine and MaxBody override DefaultMaxSSELine and DefaultMaxBody.
	MaxSSELine int
	MaxBody    int64
}

// Client sends requests to one route. It is safe for concurrent use.
type Client struct {
	route    config.Route
	dialect  Dialect
	base     string // the route's url without a trailing slash
	endpoint string
	key      string // never logged, never in errors
	redact   redactor
	http     *http.Client
	log      *slog.Logger
	timeout  time.Duration
	options  map[string]any // extra_options, cleaned
	cache    map[string]any // cache fields of the profile
	maxLine  int
	maxBody  int64
}

// New returns a Client for route, reading its API key once. The route is
// expected to have passed config validation; New checks only what it needs.
func New(route config.Route, opts Options) (*Client, error) {
	// Only a seed default route (config.SeedURLs) goes without a model
	// name: the server's own model answers.
	if route.URL == "" || (route.Model == "" && route.Seed == "") {
		return nil, errors.New("provider: route needs url and model")
	}
	if _, ok := config.CacheRetentions(route.CacheProfile); !ok && route.CacheProfile != "" {
		return nil, fmt.Errorf("provider: unknown cache_profile %q", route.CacheProfile)
	}
	d, err := DialectOf(route)
	if err != nil {
		return nil, err
	}
	base := strings.TrimRight(route.URL, "/")
	c := &Client{
		route:    route,
		dialect:  d,
		base:     base,
		endpoint: base + "/chat/completions",
		http:     opts.HTTPClient,
		log:      opts.Logger,
		timeout:  time.Duration(route.TimeoutSeconds) * time.Second,
		cache:    cacheFields(route),
		maxLine:  opts.MaxSSELine,
		maxBody:  opts.MaxBody,
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.timeout <= 0 {
		c.timeout = config.DefaultRouteTimeoutSeconds * time.Second
	}
	if c.maxLine <= 0 {
		c.maxLine = DefaultMaxSSELine
	}
	if c.maxBody <= 0 {
		c.maxBody = DefaultMaxBody
	}
	key, err := loadKey(route, opts)
	if err != nil {
		return nil, err
	}
	c.key = key
	c.redact = redactor(key)
	var dropped []string
	c.options, dropped = routeOptions(route)
	if len(dropped) > 0 {
		c.log.Warn("provider: extra_options keys ignored (set by the client or a cache profile)",
			"model", route.Model, "keys", dropped)
	}
	return c, nil
}

// loadKey reads the route's API key; "" when the route names none. Errors
// name the variable or file, never the value.
func loadKey(route config.Route, opts Options) (string, error) {
	switch {
	case route.APIKeyEnv != "":
		lookup := opts.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, ok := lookup(route.APIKeyEnv)
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return "", fmt.Errorf("provider: api_key_env %s is not set or empty", route.APIKeyEnv)
		}
		return checkKey(v, "api_key_env "+route.APIKeyEnv)
	case route.APIKeyFile != "":
		read := opts.ReadFile
		if read == nil {
			read = func(p string) ([]byte, error) { return secretfile.Read(p, MaxKeyFileBytes) }
		}
		b, err := read(route.APIKeyFile)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return "", fmt.Errorf("provider: api_key_file %s: %v", route.APIKeyFile, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("provider: api_key_file %s is empty", route.APIKeyFile)
		}
		return checkKey(v, "api_key_file "+route.APIKeyFile)
	}
	return "", nil
}

// MaxKeyFileBytes bounds an api_key_file.
const MaxKeyFileBytes = 16 << 10

func checkKey(v, where string) (string, error) {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("provider: %s holds a control character; expected one line", where)
		}
	}
	return v, nil
}

// Complete sends req and returns the complete response. The route's
// timeout_seconds bounds the whole request, stream included; canceling ctx
// aborts it promptly. Every error is an *Error. With an error, the Response
// may be non-nil and partial (see Response).
func (c *Client) Complete(ctx context.Context, req Request) (*Response, error) {
	resp, err := c.complete(ctx, req)
	var pe *Error
	if errors.As(err, &pe) && pe.URL == "" {
		pe.URL = c.endpoint
	}
	return resp, err
}

// Dialect returns the dialect the client speaks.
func (c *Client) Dialect() Dialect { return c.dialect }

// Endpoint returns the URL requests go to.
func (c *Client) Endpoint() string { return c.endpoint }

func (c *Client) complete(ctx context.Context, req Request) (*Response, error) {
	body, err := c.requestBody(req)
	if err != nil {
		return nil, &Error{Kind: KindProtocol, Msg: "encoding the request: " + c.redact.clean(err.Error())}
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	hreq, err := http.NewRequestWithContext(rctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, &Error{Kind: KindProtocol, Msg: "building the request: " + c.redact.clean(err.Error())}
	}
	hreq.Header.Set("Content-Type", "application/json")
	if req.Stream {
		hreq.Header.Set("Accept", "text/event-stream")
	} else {
		hreq.Header.Set("Accept", "application/json")
	}
	if c.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.key)
	}

	start := time.Now()
	c.log.Debug("provider: request", "url", c.endpoint, "model", c.route.Model, "stream", req.Stream,
		"messages", len(req.Messages), "bytes", len(body))
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, c.transportError(ctx, rctx, err, "sending the request")
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		e := &Error{Kind: KindHTTP, Status: resp.StatusCode, Body: c.redact.excerpt(b), URL: c.endpoint}
		if msg, code, _ := parseErrorBody(b); msg != "" || code != "" {
			e.Message, e.Code = c.redact.excerpt([]byte(msg)), c.redact.excerpt([]byte(code))
		}
		e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		c.log.Warn("provider: HTTP error", "url", c.endpoint, "model", c.route.Model, "status", resp.StatusCode,
			"retryable", e.Retryable(), "elapsed", time.Since(start))
		return nil, e
	}

	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var out *Response
	if req.Stream && mt != "application/json" {
		out, err = c.readStream(resp.Body, req.OnDelta)
	} else {
		out, err = c.readJSON(resp.Body)
	}
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			err = c.transportError(ctx, rctx, err, "reading the response")
		} else if ctx.Err() != nil || rctx.Err() != nil {
			// The stream ended because the request was aborted.
			err = c.transportError(ctx, rctx, err, "reading the response")
		}
		c.log.Warn("provider: request failed", "url", c.endpoint, "model", c.route.Model, "error", err.Error(),
			"elapsed", time.Since(start))
		return out, err
	}
	c.log.Info("provider: response", "model", c.route.Model, "finish_reason", out.FinishReason,
		"tool_calls", len(out.ToolCalls), "elapsed", time.Since(start),
		"prompt_tokens", intAttr(out.Usage.PromptTokens), "completion_tokens", intAttr(out.Usage.CompletionTokens),
		"cache_read_tokens", intAttr(out.Usage.CacheReadTokens), "cache_write_tokens", intAttr(out.Usage.CacheWriteTokens))
	return out, nil
}

// transportError classifies err: the caller's cancellation, the route's
// timeout, or a network failure.
func (c *Client) transportError(ctx, rctx context.Context, err error, doing string) *Error {
	switch {
	case ctx.Err() != nil:
		return &Error{Kind: KindCanceled, Msg: doing + ": " + ctx.Err().Error(), err: ctx.Err()}
	case rctx.Err() != nil:
		return &Error{Kind: KindTimeout, Msg: fmt.Sprintf("%s: no complete response within %s", doing, c.timeout),
			err: context.DeadlineExceeded}
	}
	msg := doing + ": " + c.redact.clean(err.Error())
	if c.route.Seed != "" {
		msg += "; " + c.route.Seed // what to start or configure
	}
	return &Error{Kind: KindNetwork, Msg: msg}
}

func intAttr(p *int) any {
	if p == nil {
		return "absent"
	}
	return *p
}

// maxModelsBody bounds a /models answer.
const maxModelsBody = 4 << 20

// Models asks the route's server which models it serves (GET {url}/models)
// and returns their ids. Errors are *Error, naming the URL.
func (c *Client) Models(ctx context.Context) ([]string, error) {
	url := c.base + "/models"
	rctx, cancel := context.WithTimeout(ctx, min(c.timeout, 10*time.Second))
	defer cancel()
	hreq, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &Error{Kind: KindProtocol, Msg: "building the request: " + c.redact.clean(err.Error()), URL: url}
	}
	hreq.Header.Set("Accept", "application/json")
	if c.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		e := c.transportError(ctx, rctx, err, "sending the request")
		e.URL = url
		return nil, e
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		e := c.transportError(ctx, rctx, err, "reading the response")
		e.URL = url
		return nil, e
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{Kind: KindHTTP, Status: resp.StatusCode, Body: c.redact.excerpt(b), URL: url}
		if msg, code, _ := parseErrorBody(b); msg != "" || code != "" {
			e.Message, e.Code = c.redact.excerpt([]byte(msg)), c.redact.excerpt([]byte(code))
		}
		return nil, e
	}
	if len(b) > maxModelsBody {
		return nil, &Error{Kind: KindProtocol, Msg: fmt.Sprintf("the model list exceeds %d bytes", maxModelsBody), URL: url}
	}
	// OpenAI's shape, which every dialect's server answers: {"data": [{"id"}]}
	// (Ollama's /api/tags would be {"models"}, but its /v1/models is this).
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, &Error{Kind: KindProtocol, Msg: "the model list is not {\"data\": [{\"id\": …}]}: " + c.redact.excerpt([]byte(err.Error())), URL: url}
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}
