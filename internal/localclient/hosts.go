package localclient

import (
	"context"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
)

// Hosts asks the daemon to inspect every worker host.
func (c *Client) Hosts(ctx context.Context) (api.Hosts, error) {
	var out api.Hosts
	err := c.do(ctx, http.MethodGet, "/v1/hosts", nil, &out)
	return out, err
}
