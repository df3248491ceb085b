package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// Bounds of the numeric and length rules.
const (
	maxRouteTimeoutSeconds = 3600
	maxCacheAffinityChars  = 64
	maxPendingAgingSeconds = 86400
	maxTasksMax            = 100000
)

// Validate checks f by the rules Parse applies, for a File built or changed
// in code. Its errors carry keys but no lines. A File that Parse returned
// passes.
func (f *File) Validate() error {
	return joinErrors(validate("", nil, f))
}

// CacheRetentions returns the cache_retention values a cache profile
// accepts (none for openai_prompt_cache_key), and whether profile is known.
func CacheRetentions(profile string) ([]string, bool) {
	switch profile {
	case CacheProfilePromptCacheKey:
		return nil, true
	case CacheProfilePromptCacheRetention:
		return []string{"in_memory", "24h"}, true
	case CacheProfilePromptCacheOptions:
		return []string{"in_memory", "24h", "30m"}, true
	}
	return nil, false
}

// ambientBatchRefusal says why [discord] ambient_batch_seconds is refused.
const ambientBatchRefusal = "is not used and is refused: ambient Discord items are deferred by the active behavior " +
	"release's settings.toml [attention] ambient_defer_seconds (default 8; change it in a draft); remove this key"

// validate checks f and returns what is wrong, each error placed at its key
// by index (nil when f did not come from a document).
func validate(name string, index *keyIndex, f *File) []*Error {
	v := &validator{name: name, index: index}
	v.agent(f)
	for _, id := range slices.Sorted(maps.Keys(f.Routes)) {
		v.route(id, f.Routes[id])
	}
	v.discord(&f.Discord)
	v.limits(&f.Limits)
	v.jobs(&f.Jobs)
	v.agents(&f.Agents)
	v.hosts(f)
	v.spend(&f.Spend)
	v.storage(&f.Storage)
	v.telemetry(&f.Telemetry)
	if f.Retention.ArtifactDays < 0 {
		v.fail("retention.artifact_days", fmt.Sprintf("%d is negative; 0 keeps every artifact", f.Retention.ArtifactDays), "retention")
	}
	if f.Retention.HistoryDays < 0 {
		v.fail("retention.history_days", fmt.Sprintf("%d is negative; 0 keeps every original", f.Retention.HistoryDays), "retention")
	}
	if f.Retention.ReleasesKeep < 0 {
		v.fail("retention.releases_keep", fmt.Sprintf("%d is negative; 0 keeps every release", f.Retention.ReleasesKeep), "retention")
	}
	// 0 in a File built in code means the default; written, it is refused.
	if c := f.Browser.CookieDays; c < 0 || c > maxCookieDays || (c == 0 && v.index.has("browser.cookie_days")) {
		v.fail("browser.cookie_days", fmt.Sprintf("%d is out of range 1..%d", c, maxCookieDays), "browser")
	}
	return v.errs
}

// validator collects the errors of one validate call.
type validator struct {
	name  string
	index *keyIndex
	errs  []*Error
}

// fail records an error about key, placed at key or, when the document does
// not write key (a required field left out, a default), at the first of near
// that it writes.
func (v *validator) fail(key, msg string, near ...string) {
	pos := v.index.find(append([]string{key}, near...)...)
	v.errs = append(v.errs, &Error{File: v.name, Line: pos.line, Column: pos.column, Key: key, Msg: msg})
}

// agent checks the budgets and that agent.route names a defined route.
func (v *validator) agent(f *File) {
	for _, b := range []struct {
		key      string
		val, max int
	}{
		{"agent.max_steps", f.Agent.MaxSteps, 10000},
		{"agent.max_tokens", f.Agent.MaxTokens, 1 << 40},
		{"agent.max_turn_seconds", f.Agent.MaxTurnSeconds, 7 * 24 * 3600},
		{"agent.max_empty_completions", f.Agent.MaxEmptyCompletions, 100},
		{"agent.max_consecutive_errors", f.Agent.MaxConsecutiveErrors, 100},
		{"agent.context_budget_tokens", f.Agent.ContextBudgetTokens, 1 << 30},
		{"agent.retry_backoff_ms", f.Agent.RetryBackoffMillis, 3600 * 1000},
		{"agent.reserve_output_tokens", f.Agent.ReserveOutputTokens, 1 << 24},
		{"agent.summary_timeout_seconds", f.Agent.SummaryTimeoutSeconds, 3600},
		{"agent.max_retry_backoff_ms", f.Agent.MaxRetryBackoffMillis, 24 * 3600 * 1000},
	} {
		if b.val < 1 || b.val > b.max {
			v.fail(b.key, fmt.Sprintf("%d is out of range 1..%d", b.val, b.max), "agent")
		}
	}
	if a := f.Agent; a.ReserveOutputTokens >= a.ContextBudgetTokens/2 && a.ContextBudgetTokens > 0 && v.index.has("agent.reserve_output_tokens") {
		v.fail("agent.reserve_output_tokens", fmt.Sprintf("%d leaves too little of agent.context_budget_tokens (%d) for the request: keep it under half",
			a.ReserveOutputTokens, a.ContextBudgetTokens), "agent")
	}
	if c := f.Agent.CompactAt; !(c >= 0.1 && c <= 1) {
		v.fail("agent.compact_at", fmt.Sprintf("%v is out of range 0.1..1 (a fraction of agent.context_budget_tokens)", c), "agent")
	}
	if r := f.Agent.SummaryRoute; r != "" {
		if _, ok := f.Routes[r]; !ok {
			v.fail("agent.summary_route", fmt.Sprintf("no [routes.%s] is defined", r), "agent")
		}
	}
	if h := f.Agent.Host; h != "" {
		if _, ok := f.Hosts[h]; !ok {
			v.fail("agent.host", fmt.Sprintf("no [hosts.%s] is defined; define the host or remove agent.host to run the workbench here", h), "agent")
		}
	}
	if a := f.Agent; a.MaxRetryBackoffMillis >= 1 && a.RetryBackoffMillis <= 3600*1000 && a.MaxRetryBackoffMillis < a.RetryBackoffMillis {
		v.fail("agent.max_retry_backoff_ms", fmt.Sprintf("%d is less than agent.retry_backoff_ms (%d); the cap must be at least the first backoff",
			a.MaxRetryBackoffMillis, a.RetryBackoffMillis), "agent")
	}
	const key = "agent.route"
	name := f.Agent.Route
	if !isRouteName(name) {
		v.fail(key, fmt.Sprintf("%q is not a route name (lowercase letters, digits, _ and -)", name), "agent")
		return
	}
	if len(f.Routes) == 0 {
		return
	}
	if _, ok := f.Routes[name]; ok {
		v.fallback(f)
		return
	}
	var names []string
	for _, id := range slices.Sorted(maps.Keys(f.Routes)) {
		names = append(names, formatKey(id))
	}
	defined := strings.Join(names, ", ")
	if v.index.has(key) || v.index == nil {
		v.fail(key, fmt.Sprintf("no [routes.%s] is defined (routes: %s)", name, defined), "agent")
		return
	}
	v.fail(key, fmt.Sprintf("defaults to %q, but no [routes.%s] is defined (routes: %s); set route in [agent]", name, name, defined),
		"agent", "routes")
}

// fallback checks agent.fallback: defined routes, none twice, not the
// agent's own route.
func (v *validator) fallback(f *File) {
	seen := map[string]bool{f.Agent.Route: true}
	for i, name := range f.Agent.Fallback {
		key := fmt.Sprintf("agent.fallback[%d]", i)
		switch {
		case name == f.Agent.Route:
			v.fail(key, fmt.Sprintf("%q is agent.route itself; a fallback is another route", name), "agent.fallback", "agent")
		case seen[name]:
			v.fail(key, fmt.Sprintf("%q is listed twice", name), "agent.fallback", "agent")
		case f.Routes[name].URL == "" && f.Routes[name].Model == "":
			v.fail(key, fmt.Sprintf("no [routes.%s] is defined", formatKey(name)), "agent.fallback", "agent")
		}
		seen[name] = true
	}
}

// route checks the route [routes.id].
func (v *validator) route(id string, r Route) {
	section := formatKey("routes", id)
	key := func(field string) string { return section + "." + field }

	if !isRouteName(id) {
		v.fail(section, "route names are lowercase letters, digits, _ and -")
	}

	if r.URL == "" {
		v.fail(key("url"), "required: the base URL of an OpenAI-compatible API, e.g. http://localhost:8001/v1", section)
	} else if msg := checkHTTPURL(r.URL); msg != "" {
		v.fail(key("url"), msg, section)
	} else if msg := checkBaseURL(r.URL); msg != "" {
		v.fail(key("url"), msg, section)
	}
	if (r.Dialect != "" || v.index.has(key("dialect"))) && !slices.Contains(Dialects(), r.Dialect) {
		v.fail(key("dialect"), fmt.Sprintf("%q is not a dialect (one of %s)", r.Dialect, strings.Join(Dialects(), ", ")), section)
	}
	switch {
	case strings.TrimSpace(r.Model) != "":
	case v.index.has(key("model")):
		v.fail(key("model"), "must not be empty", section)
	default:
		v.fail(key("model"), "required: the model name the route serves", section)
	}

	if r.APIKeyEnv != "" && !isEnvName(r.APIKeyEnv) {
		v.fail(key("api_key_env"), fmt.Sprintf("%q is not an environment variable name ([A-Z_][A-Z0-9_]*)", r.APIKeyEnv), section)
	}
	if r.APIKeyFile != "" && !filepath.IsAbs(r.APIKeyFile) {
		v.fail(key("api_key_file"), fmt.Sprintf("%q is not an absolute path", r.APIKeyFile), section)
	}
	if r.APIKeyEnv != "" && r.APIKeyFile != "" {
		v.fail(key("api_key_file"), "set api_key_env or api_key_file, not both", section)
	}

	v.cache(section, r)
	v.price(section, r.Price)

	if r.TimeoutSeconds < 1 || r.TimeoutSeconds > maxRouteTimeoutSeconds {
		v.fail(key("timeout_seconds"), fmt.Sprintf("%d is out of range 1..%d", r.TimeoutSeconds, maxRouteTimeoutSeconds), section)
	}

	options := key("extra_options")
	for _, k := range slices.Sorted(maps.Keys(r.ExtraOptions)) {
		optKey := options + "." + formatKey(k)
		if isCacheOptionKey(k) {
			v.fail(optKey, "is a cache field: declare cache_profile instead", options, section)
			continue
		}
		if _, err := json.Marshal(r.ExtraOptions[k]); err != nil {
			v.fail(optKey, "cannot be sent in a JSON request: "+strings.TrimPrefix(err.Error(), "json: "), options, section)
		}
	}
}

// cache checks the prompt-cache fields of a route.
func (v *validator) cache(section string, r Route) {
	key := func(field string) string { return section + "." + field }
	if r.CacheProfile == "" {
		const why = "needs a cache_profile: prompt caching is declared per route, never guessed"
		if r.CacheAffinity != "" || v.index.has(key("cache_affinity")) {
			v.fail(key("cache_affinity"), why, section)
		}
		if r.CacheRetention != "" {
			v.fail(key("cache_retention"), why, section)
		}
		return
	}
	accepted, ok := CacheRetentions(r.CacheProfile)
	if !ok {
		v.fail(key("cache_profile"), fmt.Sprintf("%q is not a cache profile (one of %s, %s, %s)", r.CacheProfile,
			CacheProfilePromptCacheKey, CacheProfilePromptCacheRetention, CacheProfilePromptCacheOptions), section)
		return
	}
	switch n := utf8.RuneCountInString(r.CacheAffinity); {
	case n == 0 && v.index.has(key("cache_affinity")):
		v.fail(key("cache_affinity"), "must not be empty", section)
	case n > maxCacheAffinityChars:
		v.fail(key("cache_affinity"), fmt.Sprintf("is %d characters long; at most %d", n, maxCacheAffinityChars), section)
	}
	if r.CacheRetention != "" && !slices.Contains(accepted, r.CacheRetention) {
		list := "none"
		if len(accepted) > 0 {
			list = strings.Join(accepted, ", ")
		}
		v.fail(key("cache_retention"), fmt.Sprintf("%q is not accepted by cache_profile %q (it accepts %s)",
			r.CacheRetention, r.CacheProfile, list), section)
	}
}

// discord checks the [discord] section.
func (v *validator) discord(d *Discord) {
	if msg := checkHTTPURL(d.APIBase); msg != "" {
		v.fail("discord.api_base", msg, "discord")
	}
	if d.TokenFile != "" && !filepath.IsAbs(d.TokenFile) {
		v.fail("discord.token_file", fmt.Sprintf("%q is not an absolute path", d.TokenFile), "discord")
	}
	for i, id := range d.Channels {
		if !isDigits(id) {
			v.fail(fmt.Sprintf("discord.channels[%d]", i), fmt.Sprintf("%q is not a channel id (digits)", id), "discord.channels", "discord")
		}
	}
	if d.Ingest != IngestAll && d.Ingest != IngestDirected {
		v.fail("discord.ingest", fmt.Sprintf("%q is not an ingest mode (%s or %s)", d.Ingest, IngestAll, IngestDirected), "discord")
	}
	if v.index.has(formatKey("discord", "ambient_batch_seconds")) || d.AmbientBatchSeconds != 0 {
		// Refused, never silently ignored: the delay is behavior's, not the daemon's.
		v.fail("discord.ambient_batch_seconds", ambientBatchRefusal, "discord")
	}
	if d.PendingAgingSeconds < 1 || d.PendingAgingSeconds > maxPendingAgingSeconds {
		v.fail("discord.pending_aging_seconds", fmt.Sprintf("%d is out of range 1..%d", d.PendingAgingSeconds, maxPendingAgingSeconds), "discord")
	}
	if d.AttachmentMaxBytes < 1 || d.AttachmentMaxBytes > 500<<20 {
		v.fail("discord.attachment_max_bytes", fmt.Sprintf("%d is out of range 1..%d", d.AttachmentMaxBytes, 500<<20), "discord")
	}
	if d.AttachmentTimeoutSeconds < 1 || d.AttachmentTimeoutSeconds > 3600 {
		v.fail("discord.attachment_timeout_seconds", fmt.Sprintf("%d is out of range 1..3600", d.AttachmentTimeoutSeconds), "discord")
	}
	if d.AttachmentConcurrency < 1 || d.AttachmentConcurrency > 16 {
		v.fail("discord.attachment_concurrency", fmt.Sprintf("%d is out of range 1..16", d.AttachmentConcurrency), "discord")
	}
	switch r := d.AttachmentBytesPerSecond; {
	case r != 0 && (r < 64<<10 || r > 1<<40):
		v.fail("discord.attachment_bytes_per_second", fmt.Sprintf("%d is out of range 65536..%d (0: unpaced)", r, int64(1<<40)), "discord")
	case r > 0 && d.AttachmentTimeoutSeconds > 0 && d.AttachmentMaxBytes/r >= int64(d.AttachmentTimeoutSeconds):
		v.fail("discord.attachment_bytes_per_second", fmt.Sprintf("at %d bytes a second a file of attachment_max_bytes (%d) takes %d s, not less than attachment_timeout_seconds (%d): raise the rate or the timeout",
			r, d.AttachmentMaxBytes, d.AttachmentMaxBytes/r, d.AttachmentTimeoutSeconds), "discord")
	}
	if d.AttachmentBytesPerHour < d.AttachmentMaxBytes {
		v.fail("discord.attachment_bytes_per_hour", fmt.Sprintf("%d is less than attachment_max_bytes (%d): no attachment could be fetched", d.AttachmentBytesPerHour, d.AttachmentMaxBytes), "discord")
	}
	for _, r := range []struct {
		key      string
		n, limit int
	}{{"author_burst", d.AuthorBurst, 10000}, {"author_per_minute", d.AuthorPerMinute, 100000},
		{"channel_burst", d.ChannelBurst, 10000}, {"channel_per_minute", d.ChannelPerMinute, 100000}} {
		if r.n < 1 || r.n > r.limit {
			v.fail("discord."+r.key, fmt.Sprintf("%d is out of range 1..%d", r.n, r.limit), "discord")
		}
	}
	if d.OperatorUserID != "" && (!isDigits(d.OperatorUserID) || len(d.OperatorUserID) > 20) {
		v.fail("discord.operator_user_id", fmt.Sprintf("%q is not a Discord user id (up to 20 digits: Developer Mode → right-click yourself → Copy User ID)", d.OperatorUserID), "discord")
	}
	if d.NotifyHeld && d.OperatorUserID == "" {
		v.fail("discord.notify_held", "is true, but discord.operator_user_id is not set: set it to the Discord user id to DM, or set notify_held = false", "discord")
	}
}

// limits checks the [limits] section.
func (v *validator) limits(l *Limits) {
	if _, err := l.MemoryMaxBytes(); err != nil {
		v.fail("limits.memory_max", err.Error(), "limits")
	}
	if l.TasksMax < 1 || l.TasksMax > maxTasksMax {
		v.fail("limits.tasks_max", fmt.Sprintf("%d is out of range 1..%d", l.TasksMax, maxTasksMax), "limits")
	}
	if _, err := l.CPUQuotaPercent(); err != nil {
		v.fail("limits.cpu_quota", err.Error(), "limits")
	}
}

// jobs checks the [jobs] section.
func (v *validator) jobs(given *Jobs) {
	r := given.Resolved()
	j := &r
	if j.MaxConcurrent < 1 || j.MaxConcurrent > 64 {
		v.fail("jobs.max_concurrent", fmt.Sprintf("%d is out of range 1..64", j.MaxConcurrent), "jobs")
	}
	if j.MaxWallSeconds < 1 || j.MaxWallSeconds > 7*86400 {
		v.fail("jobs.max_wall_seconds", fmt.Sprintf("%d is out of range 1..%d", j.MaxWallSeconds, 7*86400), "jobs")
	}
	if j.OutputBytes < 1 || j.OutputBytes > 1<<30 {
		v.fail("jobs.output_bytes", fmt.Sprintf("%d is out of range 1..%d", j.OutputBytes, 1<<30), "jobs")
	}
	l := j.ScopeLimits()
	if _, err := l.MemoryMaxBytes(); err != nil {
		v.fail("jobs.memory_max", err.Error(), "jobs")
	}
	if j.TasksMax < 1 || j.TasksMax > maxTasksMax {
		v.fail("jobs.tasks_max", fmt.Sprintf("%d is out of range 1..%d", j.TasksMax, maxTasksMax), "jobs")
	}
	if _, err := l.CPUQuotaPercent(); err != nil {
		v.fail("jobs.cpu_quota", err.Error(), "jobs")
	}
}

// agents checks the [agents] section.
func (v *validator) agents(given *Agents) {
	a := given.Resolved()
	for _, c := range []struct {
		key      string
		n, limit int
	}{{"agents.max_depth", a.MaxDepth, 16}, {"agents.max_descendants", a.MaxDescendants, 10000}, {"agents.max_concurrent", a.MaxConcurrent, 64},
		{"agents.max_child_wall_seconds", a.MaxChildWallSeconds, 366 * 24 * 3600}} {
		if c.n < 1 || c.n > c.limit {
			v.fail(c.key, fmt.Sprintf("%d is out of range 1..%d", c.n, c.limit), "agents")
		}
	}
	if a.MaxTreeTokens < 1 || a.MaxTreeTokens > 1_000_000_000_000 {
		v.fail("agents.max_tree_tokens", fmt.Sprintf("%d is out of range 1..1000000000000", a.MaxTreeTokens), "agents")
	}
	for _, c := range []struct {
		key string
		n   int
	}{{"agents.max_spawns_per_tree", a.MaxSpawnsPerTree}, {"agents.max_spawns_per_day", a.MaxSpawnsPerDay}} {
		if c.n < 0 || c.n > MaxSpawnsCap {
			v.fail(c.key, fmt.Sprintf("%d is out of range 0..%d (0: no cap)", c.n, MaxSpawnsCap), "agents")
		}
	}
	if a.ModelSlots < 2 || a.ModelSlots > 256 {
		v.fail("agents.model_slots", fmt.Sprintf("%d is out of range 2..256: one slot is kept for roots, so children need at least a second", a.ModelSlots), "agents")
	}
}

// checkHTTPURL returns what is wrong with s as the base URL of an HTTP API,
// or "".
func checkHTTPURL(s string) string {
	if s == "" {
		return "required: an http or https URL"
	}
	u, err := url.Parse(s)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Sprintf("%q is not a URL: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Sprintf("%q is not an http or https URL", s)
	}
	if u.Hostname() == "" {
		return fmt.Sprintf("%q has no host", s)
	}
	if u.User != nil {
		// Secrets stay out of this file, and URLs end up in logs.
		return "a URL here must not carry credentials; keep secrets out of klbr.toml"
	}
	return ""
}

// checkBaseURL refuses a route url that names an endpoint rather than the
// API's base: the client appends /chat/completions and /models itself.
func checkBaseURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	path := strings.TrimRight(u.Path, "/")
	for _, suffix := range []string{"/chat/completions", "/completions", "/models"} {
		if strings.HasSuffix(path, suffix) {
			u.Path = strings.TrimSuffix(path, suffix)
			return fmt.Sprintf("%q ends in %s, but url is the API's base URL (klbr adds %s itself); use %q", s, suffix, suffix, u.String())
		}
	}
	return ""
}

// isRouteName reports whether s matches [a-z0-9_-]+.
func isRouteName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// isEnvName reports whether s matches [A-Z_][A-Z0-9_]*.
func isEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// isDigits reports whether s is one or more ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
