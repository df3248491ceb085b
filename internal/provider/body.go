package provider

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
)

// cacheFields returns the request fields a route's cache_profile declares.
// This is the one place that reads seed 000 ("model seam") into the wire:
//
//   - no profile: no cache field at all. An unknown OpenAI-style route must
//     not receive a field it may reject; DeepSeek's automatic cache needs
//     none.
//   - openai_prompt_cache_key: prompt_cache_key = cache_affinity. The
//     profile accepts no retention (config rejects one).
//   - openai_prompt_cache_retention: prompt_cache_key = cache_affinity and,
//     when set, prompt_cache_retention = cache_retention (in_memory | 24h).
//   - openai_prompt_cache_options: one object,
//     prompt_cache_options = {key: cache_affinity, retention: cache_retention}
//     (retention in_memory | 24h | 30m), each member only when set.
//
// cache_affinity is a stable key for related requests, never per request, so
// it is the route's value verbatim. An empty affinity or retention is left
// out rather than sent empty.
func cacheFields(r config.Route) map[string]any {
	out := map[string]any{}
	switch r.CacheProfile {
	case config.CacheProfilePromptCacheKey:
		if r.CacheAffinity != "" {
			out["prompt_cache_key"] = r.CacheAffinity
		}
	case config.CacheProfilePromptCacheRetention:
		if r.CacheAffinity != "" {
			out["prompt_cache_key"] = r.CacheAffinity
		}
		if r.CacheRetention != "" {
			out["prompt_cache_retention"] = r.CacheRetention
		}
	case config.CacheProfilePromptCacheOptions:
		opts := map[string]string{}
		if r.CacheAffinity != "" {
			opts["key"] = r.CacheAffinity
		}
		if r.CacheRetention != "" {
			opts["retention"] = r.CacheRetention
		}
		if len(opts) > 0 {
			out["prompt_cache_options"] = opts
		}
	}
	return out
}

// reservedFields are set by the client; extra_options cannot override them.
var reservedFields = []string{"model", "messages", "tools", "stream", "stream_options"}

// routeOptions returns the route's extra_options without cache fields (Parse
// already removed them; a Route built in code is checked again here) and
// without the fields the client sets, and the keys it dropped.
func routeOptions(r config.Route) (map[string]any, []string) {
	out := make(map[string]any, len(r.ExtraOptions))
	var dropped []string
	for k, v := range r.ExtraOptions {
		if isReserved(k, config.CacheOptionKeys()) || isReserved(k, reservedFields) {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	return out, dropped
}

func isReserved(k string, list []string) bool {
	for _, c := range list {
		if strings.EqualFold(c, k) {
			return true
		}
	}
	return false
}

// requestBody builds the JSON body of req in the route's dialect.
func (c *Client) requestBody(req Request) ([]byte, error) {
	body := maps.Clone(c.options)
	if body == nil {
		body = map[string]any{}
	}
	maps.Copy(body, c.cache)
	if c.route.Model != "" { // "" on a seed default route: the server's own model
		body["model"] = c.route.Model
	}
	body["messages"] = replay(c.dialect, withoutImages(c.route, req.Messages))
	if len(req.Tools) > 0 {
		body["tools"] = req.Tools
	}
	body["stream"] = req.Stream
	if req.MaxTokens > 0 {
		body["max_tokens"] = req.MaxTokens
	}
	if req.Stream && c.dialect.StreamUsage {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	return json.Marshal(body)
}

// withoutImages is msgs without their images unless the route has vision
// (a copy when any had some: the caller's messages stay as they were).
func withoutImages(r config.Route, msgs []Message) []Message {
	if r.Vision {
		return msgs
	}
	var out []Message
	for i, m := range msgs {
		if len(m.Images) == 0 {
			continue
		}
		if out == nil {
			out = slices.Clone(msgs)
		}
		out[i].Images = nil
	}
	if out == nil {
		return msgs
	}
	return out
}
