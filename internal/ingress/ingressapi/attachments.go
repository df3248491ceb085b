package ingressapi

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

// Attachment fetching (docs/discord.md, "Attachments"): klbr-discord fetches
// an admitted attachment's bytes from Discord's CDN, apart from admission,
// and streams them to klbr-core, which stores them as an artifact:
// PUT /v1/attachments/{message}/{attachment} with the bytes as the body, or
// POST /v1/attachments/{message}/{attachment}/failure when the fetch ended
// without them. Each attachment has one outcome; a second is 409.
const (
	// MaxPendingFetches bounds the fetches a hello hands a starting transport.
	MaxPendingFetches = 256
	// MaxFailureDetailBytes bounds a failure's detail.
	MaxFailureDetailBytes = 512
)

// Fetch failure codes.
const (
	FetchTooLarge = "too_large" // past [discord] attachment_max_bytes
	FetchTimeout  = "timeout"   // past [discord] attachment_timeout_seconds
	FetchExpired  = "expired"   // the link expired and refreshing it did not help
	FetchBudget   = "budget"    // past [discord] attachment_bytes_per_hour
	FetchHTTP     = "http"      // the CDN answered another error (the detail says which)
	FetchNetwork  = "network"
	FetchStorage  = "storage" // klbr-core could not store it ([storage] max_bytes)
)

// PendingFetch is an admitted attachment whose fetch has no outcome yet.
type PendingFetch struct {
	MessageID   string `json:"message_id"`
	ChannelID   string `json:"channel_id"`
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
	URL         string `json:"url"`
}

// FetchFailure is POST /v1/attachments/{message}/{attachment}/failure.
type FetchFailure struct {
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

// FetchResult answers an upload or a failure.
type FetchResult struct {
	State  string `json:"state"` // fetched or failed
	SHA256 string `json:"sha256,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

func attachmentPath(message, id string) string {
	return "/v1/attachments/" + url.PathEscape(message) + "/" + url.PathEscape(id)
}

// UploadAttachment streams an attachment's bytes (size of them, as the CDN
// announced; -1 when unknown) to the core.
func (c *Client) UploadAttachment(ctx context.Context, message, id string, body io.Reader, size int64) (FetchResult, error) {
	var res FetchResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://ingress"+attachmentPath(message, id), body)
	if err != nil {
		return res, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	return res, c.send(ctx, req, attachmentPath(message, id), &res)
}

// AttachmentFailed records that an attachment's fetch ended without its bytes.
func (c *Client) AttachmentFailed(ctx context.Context, message, id string, f FetchFailure) (FetchResult, error) {
	var res FetchResult
	return res, c.do(ctx, attachmentPath(message, id)+"/failure", f, &res)
}
