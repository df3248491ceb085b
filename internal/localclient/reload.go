package localclient

import (
	"context"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
)

// Reload asks the daemon to reread klbr.toml and apply what can change
// live; a file that does not parse is refused (the error says why) and
// the running configuration stays.
func (c *Client) Reload(ctx context.Context) (api.Reloaded, error) {
	var out api.Reloaded
	err := c.do(ctx, http.MethodPost, "/v1/reload", struct{}{}, &out)
	return out, err
}
