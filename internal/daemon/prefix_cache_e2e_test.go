package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// cacheShare is the share of the agent's prompt tokens (requests with
// tools) that an emulated prefix cache served, and the same for the
// summarizer's requests.
func cacheShare(reqs []modeltest.Request) (agent, summaries float64) {
	var p, c, sp, sc int
	for _, r := range reqs {
		if len(r.Tools) == 0 {
			sp, sc = sp+r.PromptTokens, sc+r.CachedTokens
			continue
		}
		p, c = p+r.PromptTokens, c+r.CachedTokens
	}
	return float64(c) / float64(max(p, 1)), float64(sc) / float64(max(sp, 1))
}

// prefixBreaks lists, for each agent request that does not extend the
// previous one, the first message that differs: what broke the prefix.
func prefixBreaks(reqs []modeltest.Request) []string {
	var out []string
	var prev *modeltest.Request
	for i := range reqs {
		r := &reqs[i]
		if len(r.Tools) == 0 {
			continue
		}
		if prev != nil {
			if !reflect.DeepEqual(prev.Tools, r.Tools) {
				out = append(out, fmt.Sprintf("request %d: the tool schema", i))
			}
			for j := range min(len(prev.Messages), len(r.Messages)) {
				if !reflect.DeepEqual(prev.Messages[j], r.Messages[j]) {
					a, _ := json.Marshal(prev.Messages[j])
					b, _ := json.Marshal(r.Messages[j])
					out = append(out, fmt.Sprintf("request %d: message %d of %d: %.160s → %.160s", i, j, len(prev.Messages), a, b))
					break
				}
			}
		}
		prev = r
	}
	return out
}

// A 500-step session under a small budget, compacted as it goes, against a
// model that emulates a provider's prefix cache: at least 85 % of the
// agent's prompt tokens are served from the cache. A request repeats the
// previous one byte for byte up to its newest changes; only a compaction
// changes it, and only from its cut on.
func TestPromptCacheShareOverLongSession(t *testing.T) {
	const steps, budget = 500, 6000
	model := modeltest.New()
	defer model.Close()
	model.EmulatePrefixCache()
	var step atomic.Int32
	model.Otherwise(func(int) modeltest.Reply {
		n := step.Add(1)
		if n > steps {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d: keep counting", n),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('marker%d', 'x' * 300)", n)}}}
	})
	var summaries atomic.Int32
	model.ToolFree(func(req modeltest.Request) modeltest.Reply {
		summaries.Add(1)
		return modeltest.Reply{Text: fmt.Sprintf("Summary %d: the agent counted steps and printed markers.", summaries.Load())}
	})
	a := startAgent(t, model, fmt.Sprintf("context_budget_tokens = %d\nmax_steps = %d\n", budget, steps+10))
	a.send("count to five hundred, one cell at a time")
	a.eventually("the session waits", a.state(store.StateWaiting))

	reqs := model.Requests()
	share, sumShare := cacheShare(reqs)
	breaks := prefixBreaks(reqs)
	t.Logf("prompt cache share over %d requests: agent %.1f %%, summarizer %.1f %%; %d compactions; %d prefix breaks",
		len(reqs), 100*share, 100*sumShare, summaries.Load(), len(breaks))
	for i, b := range breaks {
		if i < 12 {
			t.Log(b)
		}
	}
	if share < 0.85 {
		t.Errorf("the prefix cache served %.1f %% of the agent's prompt tokens; want at least 85 %%", 100*share)
	}
	if n := len(breaks); n > int(summaries.Load()) {
		t.Errorf("%d prefix breaks for %d compactions: something but a compaction changes the prefix", n, summaries.Load())
	}
	// The recorded cached tokens reach the ledger, status and the metrics.
	st, err := a.c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var prompt, cached int64
	for _, r := range reqs {
		prompt, cached = prompt+int64(r.PromptTokens), cached+int64(r.CachedTokens)
	}
	if len(st.PromptCache) != 1 || st.PromptCache[0].Route != "main" || st.PromptCache[0].Prompt != prompt || st.PromptCache[0].Cached != cached {
		t.Errorf("status prompt cache: %+v; the requests (the agent's and the summarizer's) sent %d prompt tokens, %d cached", st.PromptCache, prompt, cached)
	}
	if want := fmt.Sprintf(`klbr_prompt_cache_hit_ratio{route="main"} %.3f`, float64(cached)/float64(prompt)); !strings.Contains(a.scrape(), want[:len(want)-1]) {
		t.Errorf("metrics lack %s", want)
	}
}

// The 500-step session of TestPromptCacheShareOverLongSession (under a
// budget of 8000 tokens: the maintenance skill takes room) with what
// varies in a real one: it begins as a maintenance goal, the operator
// chats in at steps 150 and 350, and a managed skill is added every 50
// steps. Only compactions change a request's prefix, and the share of the
// agent's prompt tokens the cache serves stays above 85 %.
func TestPromptCacheShareWithChangingContext(t *testing.T) {
	const steps, budget = 500, 8000 // the maintenance skill stays with its goal: more room than 6000
	model := modeltest.New()
	defer model.Close()
	model.EmulatePrefixCache()
	var step atomic.Int32
	var a *agent
	ready := make(chan struct{})
	model.Otherwise(func(int) modeltest.Reply {
		<-ready
		n := step.Add(1)
		if n > steps {
			return modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='done')"}}}
		}
		if n%50 == 0 {
			dir := filepath.Join(a.data, "skills", fmt.Sprintf("skill%d", n))
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, "SKILL.md"), []byte(fmt.Sprintf("# skill %d\nA helper learned at step %d.\n", n, n)), 0o644)
		}
		if n == 150 || n == 350 {
			go a.c.Send(context.Background(), "default", api.SendRequest{Text: fmt.Sprintf("how far are you? (%d)", n), SourceKey: fmt.Sprintf("chat-%d", n)})
		}
		return modeltest.Reply{Text: fmt.Sprintf("step %d: keep counting", n),
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print('marker%d', 'x' * 300)", n)}}}
	})
	var summaries atomic.Int32
	model.ToolFree(func(req modeltest.Request) modeltest.Reply {
		summaries.Add(1)
		return modeltest.Reply{Text: fmt.Sprintf("Summary %d: the agent counted steps and printed markers.", summaries.Load())}
	})
	a = startAgent(t, model, fmt.Sprintf("context_budget_tokens = %d\nmax_steps = %d\n", budget, steps+10))
	close(ready)
	if _, err := a.c.Send(t.Context(), "default", api.SendRequest{Text: "count to five hundred, one cell at a time", SourceKey: "maint", Maintenance: true}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the session waits after the last step", func() bool {
		return step.Load() > steps && a.session().State == store.StateWaiting
	})
	reqs := model.Requests()
	share, sumShare := cacheShare(reqs)
	breaks := prefixBreaks(reqs)
	t.Logf("prompt cache share over %d requests: agent %.1f %%, summarizer %.1f %%; %d compactions; %d prefix breaks",
		len(reqs), 100*share, 100*sumShare, summaries.Load(), len(breaks))
	for _, b := range breaks {
		if !strings.Contains(b, "[klbr summary") {
			t.Errorf("not a compaction: %s", b)
		}
	}
	if share < 0.85 {
		t.Errorf("the prefix cache served %.1f %% of the agent's prompt tokens; want at least 85 %%", 100*share)
	}
}
