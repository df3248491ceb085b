// Package localclient is the one typed client of the operator API on
// control.sock. The CLI uses it; so may any local tool.
package localclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// Client talks to one daemon's control socket.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client of the control socket at path.
func New(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
	}
	return &Client{socket: path, http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Error is a non-2xx answer of the daemon.
type Error struct {
	Status int
	api.ErrorBody
}

func (e *Error) Error() string { return e.Message }

// ErrUnreachable wraps a failure to reach the daemon at all.
var ErrUnreachable = errors.New("klbr-core is not reachable")

// Status reads the daemon's status.
func (c *Client) Status(ctx context.Context) (api.Status, error) {
	var st api.Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// Browser asks the running daemon where its browser UI is, with the token.
func (c *Client) Browser(ctx context.Context) (api.Browser, error) {
	var b api.Browser
	err := c.do(ctx, http.MethodGet, "/v1/browser", nil, &b)
	return b, err
}

// RotateToken replaces the operator token, signing every browser out, and
// returns the browser URL with the new one.
func (c *Client) RotateToken(ctx context.Context) (api.Browser, error) {
	var b api.Browser
	err := c.do(ctx, http.MethodPost, "/v1/browser/rotate", struct{}{}, &b)
	return b, err
}

// Session reads one session's status.
func (c *Client) Session(ctx context.Context, id string) (api.SessionStatus, error) {
	var st api.SessionStatus
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id), nil, &st)
	return st, err
}

// Usage reads what a session's model requests cost, as recorded.
func (c *Client) Usage(ctx context.Context, session string) (store.Usage, error) {
	var u store.Usage
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(session)+"/usage", nil, &u)
	return u, err
}

// Send admits an operator input and returns once it is committed.
func (c *Client) Send(ctx context.Context, session string, req api.SendRequest) (api.SendResponse, error) {
	var resp api.SendResponse
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/inputs", req, &resp)
	return resp, err
}

// Records reads one page of a session's records after since.
func (c *Client) Records(ctx context.Context, session string, since int64, limit int) (api.Records, error) {
	return c.RecordsFrom(ctx, session, strconv.FormatInt(since, 10), limit)
}

// RecordsFrom is Records after a cursor that is a seq or a record's ref (e123).
func (c *Client) RecordsFrom(ctx context.Context, session, since string, limit int) (api.Records, error) {
	var recs api.Records
	q := url.Values{"since": {since}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(session)+"/records?"+q.Encode(), nil, &recs)
	return recs, err
}

// Follow streams a session's records after since to fn until ctx ends, fn
// returns an error, or the daemon closes the stream (then it returns nil).
func (c *Client) Follow(ctx context.Context, session string, since int64, fn func(store.Record) error) error {
	return c.FollowFrom(ctx, session, strconv.FormatInt(since, 10), fn)
}

// FollowFrom is Follow after a cursor that is a seq or a record's ref (e123).
func (c *Client) FollowFrom(ctx context.Context, session, since string, fn func(store.Record) error) error {
	q := url.Values{"since": {since}, "follow": {"1"}}
	resp, err := c.send(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(session)+"/records?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var rec store.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return fmt.Errorf("follow: malformed record: %w", err)
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("follow: %w", err)
	}
	return ctx.Err()
}

// DrainSession closes a session's admission, waits for its work and stops it.
func (c *Client) DrainSession(ctx context.Context, session string) (store.Session, error) {
	return c.sessionMove(ctx, session, "drain")
}

// StopSession stops a session.
func (c *Client) StopSession(ctx context.Context, session string) (store.Session, error) {
	return c.sessionMove(ctx, session, "stop")
}

// StartSession makes a stopped session ready again.
func (c *Client) StartSession(ctx context.Context, session string) (store.Session, error) {
	return c.sessionMove(ctx, session, "start")
}

func (c *Client) sessionMove(ctx context.Context, session, verb string) (store.Session, error) {
	var s store.Session
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/"+verb, nil, &s)
	return s, err
}

// Drain asks the daemon to drain and exit. It returns once the daemon accepted.
func (c *Client) Drain(ctx context.Context) (api.Accepted, error) {
	var a api.Accepted
	err := c.do(ctx, http.MethodPost, "/v1/drain", nil, &a)
	return a, err
}

// Stop asks the daemon to interrupt its work and exit.
func (c *Client) Stop(ctx context.Context) (api.Accepted, error) {
	var a api.Accepted
	err := c.do(ctx, http.MethodPost, "/v1/stop", nil, &a)
	return a, err
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: malformed answer: %w", method, path, err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://klbr-core"+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w at %s (is `klbr-core serve` running, and is KLBR_DATA_DIR or KLBR_CONTROL_SOCKET the same as its?): %w", ErrUnreachable, c.socket, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var e api.Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			e.Error = api.ErrorBody{Code: api.CodeInternal, Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(b))}
		}
		return nil, &Error{Status: resp.StatusCode, ErrorBody: e.Error}
	}
	return resp, nil
}

// Exec runs a cell in a session's workbench and returns its recorded outcome.
func (c *Client) Exec(ctx context.Context, session string, req api.ExecRequest) (workbench.Result, error) {
	var res workbench.Result
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/exec", req, &res)
	return res, err
}

// Reset starts a new context epoch for a session (the archive is kept);
// with kernel, it also kills the session's workbench, so the next cell
// starts a new generation.
func (c *Client) Reset(ctx context.Context, session, reason string, kernel bool) (api.Accepted, error) {
	var a api.Accepted
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/reset", api.ResetRequest{Reason: reason, Kernel: kernel}, &a)
	return a, err
}

// Compact runs a manual compaction of a session's context.
func (c *Client) Compact(ctx context.Context, session string) (api.Compacted, error) {
	var a api.Compacted
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/compact", struct{}{}, &a)
	return a, err
}

// SearchHistory searches a session's history.
func (c *Client) SearchHistory(ctx context.Context, session, query string, sc history.Scope, limit int) (store.SearchResult, error) {
	q := url.Values{"q": {query}, "limit": {strconv.Itoa(limit)}}
	for k, v := range map[string]string{"lane": sc.Lane, "conversation": sc.Conversation, "since": sc.Since, "until": sc.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if sc.Before != 0 {
		q.Set("before", strconv.FormatInt(sc.Before, 10))
	}
	var res store.SearchResult
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(session)+"/history?"+q.Encode(), nil, &res)
	return res, err
}

// ReadHistory reads a history reference's exact original, bounded.
func (c *Client) ReadHistory(ctx context.Context, ref string, maxBytes int, offset int64) (history.Read, error) {
	q := url.Values{"max_bytes": {strconv.Itoa(maxBytes)}, "offset": {strconv.FormatInt(offset, 10)}}
	var res history.Read
	err := c.do(ctx, http.MethodGet, "/v1/history/"+url.PathEscape(ref)+"?"+q.Encode(), nil, &res)
	return res, err
}

// HistoryChildren lists what a summary covers.
func (c *Client) HistoryChildren(ctx context.Context, ref string) ([]store.Child, error) {
	var res []store.Child
	err := c.do(ctx, http.MethodGet, "/v1/history/"+url.PathEscape(ref)+"/children", nil, &res)
	return res, err
}

// Items lists a session's attention items, newest first; statuses filters
// (none: all).
func (c *Client) Items(ctx context.Context, session string, statuses []string, limit int) (api.Items, error) {
	q := url.Values{}
	if len(statuses) > 0 {
		q.Set("status", strings.Join(statuses, ","))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.Items
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(session)+"/items?"+q.Encode(), nil, &out)
	return out, err
}

// Mark records the operator's decision on an attention item.
func (c *Client) Mark(ctx context.Context, item int64, status, note string) (store.AttentionItem, error) {
	var out store.AttentionItem
	err := c.do(ctx, http.MethodPost, "/v1/items/"+strconv.FormatInt(item, 10)+"/mark", api.MarkRequest{Status: status, Note: note}, &out)
	return out, err
}

// Held lists the Discord effects delivery.review held, oldest first.
func (c *Client) Held(ctx context.Context, limit int) (api.Held, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.Held
	err := c.do(ctx, http.MethodGet, "/v1/held?"+q.Encode(), nil, &out)
	return out, err
}

// Release lets a held effect go out; Drop refuses it for good. Either
// answers the effect as it now is.
func (c *Client) Release(ctx context.Context, effect int64, note string) (store.Effect, error) {
	return c.decide(ctx, effect, "release", note)
}

// Drop refuses a held effect for good.
func (c *Client) Drop(ctx context.Context, effect int64, note string) (store.Effect, error) {
	return c.decide(ctx, effect, "drop", note)
}

func (c *Client) decide(ctx context.Context, effect int64, verb, note string) (store.Effect, error) {
	var out store.Effect
	err := c.do(ctx, http.MethodPost, "/v1/held/"+strconv.FormatInt(effect, 10)+"/"+verb, api.DecideRequest{Note: note}, &out)
	return out, err
}

// Releases lists releases and each session's behavior.
func (c *Client) Releases(ctx context.Context) (api.Releases, error) {
	var r api.Releases
	err := c.do(ctx, http.MethodGet, "/v1/releases", nil, &r)
	return r, err
}

// Activate activates a release for a session at its expected epoch.
func (c *Client) Activate(ctx context.Context, session string, req api.ActivateRequest) (activation.Result, error) {
	var r activation.Result
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/activate", req, &r)
	return r, err
}

// Rollback activates the session's newest earlier release.
func (c *Client) Rollback(ctx context.Context, session string) (activation.Result, error) {
	var r activation.Result
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/rollback", nil, &r)
	return r, err
}

// Replay delivers an observer's events again with fake effects.
func (c *Client) Replay(ctx context.Context, session string, req api.ReplayRequest) (api.Replay, error) {
	var r api.Replay
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/hooks/replay", req, &r)
	return r, err
}

// Publish publishes the tree at an absolute path as a release.
func (c *Client) Publish(ctx context.Context, path string) (api.Release, error) {
	var r api.Release
	err := c.do(ctx, http.MethodPost, "/v1/releases", api.PublishRequest{Path: path}, &r)
	return r, err
}

// Jobs lists jobs, newest first; session and state may be empty.
func (c *Client) Jobs(ctx context.Context, session, state string, limit int) (api.Jobs, error) {
	q := url.Values{}
	if session != "" {
		q.Set("session", session)
	}
	if state != "" {
		q.Set("state", state)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.Jobs
	err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &out)
	return out, err
}

// Job reads one job.
func (c *Client) Job(ctx context.Context, id int64) (store.Job, error) {
	var out store.Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), nil, &out)
	return out, err
}

// CancelJob cancels a job; a running one's whole process tree is killed.
func (c *Client) CancelJob(ctx context.Context, id int64) (store.Job, error) {
	var out store.Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/cancel", nil, &out)
	return out, err
}

// GC runs garbage collection in the running daemon, under its [retention].
func (c *Client) GC(ctx context.Context) (datadir.GCResult, error) {
	var r datadir.GCResult
	err := c.do(ctx, http.MethodPost, "/v1/gc", nil, &r)
	return r, err
}
