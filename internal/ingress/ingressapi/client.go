package ingressapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
)

// Client talks to klbr-core's ingress socket.
type Client struct {
	http  *http.Client
	fence atomic.Pointer[string] // the token of the last hello
}

// NewClient returns a client of the ingress socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:        8,
		MaxIdleConnsPerHost: 8,
	}
	return &Client{http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// StatusError is a non-2xx answer of the core.
type StatusError struct {
	Status int
	ErrorBody
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("klbr-core answered %d %s: %s", e.Status, e.Code, e.Message)
}

// Permanent reports whether retrying the same request cannot help.
func (e *StatusError) Permanent() bool {
	return e.Status == http.StatusBadRequest || e.Status == http.StatusForbidden ||
		e.Status == http.StatusNotFound || e.Status == http.StatusRequestEntityTooLarge || e.Status == http.StatusConflict
}

// ErrUnreachable wraps a failure to reach the core at all (it is restarting,
// or not running): retry.
var ErrUnreachable = errors.New("klbr-core's ingress socket is not reachable")

// Admit admits a batch and returns once every admitted message is committed.
func (c *Client) Admit(ctx context.Context, req AdmitRequest) (AdmitResponse, error) {
	var resp AdmitResponse
	err := c.do(ctx, "/v1/inputs", req, &resp)
	if err == nil && len(resp.Results) != len(req.Messages) {
		err = fmt.Errorf("admit: %d results for %d messages", len(resp.Results), len(req.Messages))
	}
	return resp, err
}

// Hello announces a transport start and returns the effects to reconcile.
func (c *Client) Hello(ctx context.Context, req HelloRequest) (HelloResponse, error) {
	var resp HelloResponse
	err := c.do(ctx, "/v1/transport/hello", req, &resp)
	if err == nil {
		c.fence.Store(&resp.Fence)
	}
	return resp, err
}

// Fenced reports whether err says another transport is the sender, or
// this one's token is stale.
func Fenced(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == CodeFenced
}

// Claim waits up to req.WaitMS for effects and reads.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) (ClaimResponse, error) {
	var resp ClaimResponse
	return resp, c.do(ctx, "/v1/effects/claim", req, &resp)
}

// Receipt reports an effect's outcome.
func (c *Client) Receipt(ctx context.Context, id int64, r Receipt) (ReceiptResponse, error) {
	var resp ReceiptResponse
	return resp, c.do(ctx, "/v1/effects/"+strconv.FormatInt(id, 10)+"/receipt", r, &resp)
}

// AnswerRead answers a read request.
func (c *Client) AnswerRead(ctx context.Context, id int64, a ReadAnswer) error {
	var resp struct{}
	return c.do(ctx, "/v1/reads/"+strconv.FormatInt(id, 10), a, &resp)
}

// HeldNotified reports the outcome of a held effect's notice.
func (c *Client) HeldNotified(ctx context.Context, id int64, n HeldNotified) error {
	var resp struct{}
	return c.do(ctx, "/v1/held/"+strconv.FormatInt(id, 10)+"/notified", n, &resp)
}

// DecideHeld passes on the operator's button press on a held effect's notice.
func (c *Client) DecideHeld(ctx context.Context, id int64, d HeldDecision) (HeldDecided, error) {
	var resp HeldDecided
	return resp, c.do(ctx, "/v1/held/"+strconv.FormatInt(id, 10)+"/decide", d, &resp)
}

func (c *Client) do(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://ingress"+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.send(ctx, req, path, out)
}

// send sends req (fenced) and decodes a 2xx JSON answer into out.
func (c *Client) send(ctx context.Context, req *http.Request, path string, out any) error {
	if f := c.fence.Load(); f != nil && *f != "" {
		req.Header.Set(FenceHeader, *f)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("%w: reading the answer: %w", ErrUnreachable, err)
	}
	if len(data) > MaxResponseBytes {
		return fmt.Errorf("ingress %s: answer larger than %d bytes", path, MaxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
			e.Error = ErrorBody{Code: CodeInternal, Message: http.StatusText(resp.StatusCode)}
		}
		return &StatusError{Status: resp.StatusCode, ErrorBody: e.Error}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("ingress %s: malformed answer: %w", path, err)
	}
	return nil
}
