package modeltest

import "encoding/json"

// A prefix cache as providers keep one: a request's prompt is served from
// the cache for as long as it repeats, byte for byte, the prompt of a
// recent request. The prompt is what a provider renders first: the tool
// schema, then the messages in order. Tokens are counted as bytes/4.

// cacheEntries is how many recent prompts the cache holds: a summarizer's
// request between two of the agent's does not evict the agent's prefix.
const cacheEntries = 8

type prefixCache struct {
	recent [][]byte // newest last
}

// EmulatePrefixCache makes the server report usage on every response:
// prompt_tokens is the prompt's size and prompt_tokens_details.cached_tokens
// the longest prefix it shares with one of the last few prompts. A reply's
// own Usage keys win.
func (s *Server) EmulatePrefixCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache = &prefixCache{}
}

// serve returns a request body's prompt size and cached part in tokens,
// and keeps its prompt.
func (c *prefixCache) serve(body []byte) (prompt, cached int) {
	var parts struct {
		Tools    json.RawMessage `json:"tools"`
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &parts)
	p := append(append([]byte{}, parts.Tools...), parts.Messages...)
	best := 0
	for _, old := range c.recent {
		best = max(best, commonPrefix(old, p))
	}
	c.recent = append(c.recent, p)
	if len(c.recent) > cacheEntries {
		c.recent = c.recent[1:]
	}
	return (len(p) + 3) / 4, best / 4
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// cacheUsage is a reply's usage with the emulated cache's counts.
func cacheUsage(u map[string]any, req Request) map[string]any {
	out := map[string]any{"prompt_tokens": req.PromptTokens, "completion_tokens": 10,
		"total_tokens": req.PromptTokens + 10, "prompt_tokens_details": map[string]any{"cached_tokens": req.CachedTokens}}
	for k, v := range u {
		out[k] = v
	}
	return out
}
