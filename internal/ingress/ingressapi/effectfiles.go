package ingressapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Files a send carries (docs/discord.md, "Files out"): the claimed effect
// lists them (EffectFile); klbr-discord reads each one's bytes with
// GET /v1/effects/{id}/files/{n} and uploads them with the message.
const (
	// MaxSendFiles and MaxSendFileBytes are Discord's limits on one
	// message's uploads for a bot: 10 files, 10 MiB together.
	MaxSendFiles     = 10
	MaxSendFileBytes = 10 << 20
)

// EffectFile is a file a send carries.
type EffectFile struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
}

func effectFilePath(id int64, n int) string {
	return "/v1/effects/" + strconv.FormatInt(id, 10) + "/files/" + strconv.Itoa(n)
}

// EffectFile reads file n of effect id, at most max bytes.
func (c *Client) EffectFile(ctx context.Context, id int64, n int, max int64) ([]byte, error) {
	path := effectFilePath(id, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://ingress"+path, nil)
	if err != nil {
		return nil, err
	}
	if f := c.fence.Load(); f != nil && *f != "" {
		req.Header.Set(FenceHeader, *f)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e Error
		data, _ := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes))
		if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
			e.Error = ErrorBody{Code: CodeInternal, Message: http.StatusText(resp.StatusCode)}
		}
		return nil, &StatusError{Status: resp.StatusCode, ErrorBody: e.Error}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrUnreachable, path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("ingress %s: more than %d bytes", path, max)
	}
	return b, nil
}
