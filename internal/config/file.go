package config

import (
	"bytes"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// File is klbr.toml: model routes, the Discord transport and the limits of
// worker scopes. Every section is optional. Parse fills the defaults below
// into omitted fields and refuses keys it does not know.
type File struct {
	Agent   Agent            `toml:"agent"`
	Routes  map[string]Route `toml:"routes"`
	Discord Discord          `toml:"discord"`
	Limits  Limits           `toml:"limits"`
	Jobs    Jobs             `toml:"jobs"`
	Agents  Agents           `toml:"agents"`
	Browser Browser          `toml:"browser"`
	// Hosts are the worker hosts, by name ([hosts.NAME]).
	Hosts map[string]Host `toml:"hosts"`
	// Retention is the [retention] section: what `klbr-core gc` may remove.
	Retention Retention `toml:"retention"`
	// Spend is the [spend] section: caps on what model requests cost
	// (spend.go).
	Spend Spend `toml:"spend"`
	// Storage is the [storage] section: the bound on the data directory.
	Storage Storage `toml:"storage"`
	// Telemetry is the [telemetry] section: traces (telemetry.go).
	Telemetry Telemetry `toml:"telemetry"`

	// SeedRoutes is set when no route was configured and the seed's
	// default routes are in force (seed.go); never read from the file.
	SeedRoutes bool `toml:"-"`
}

// Retention is the [retention] section. Zero keeps everything (the
// default). Garbage collection never removes what is pinned: the active
// and last good releases, releases of attempts that have not ended, of
// jobs and of drafts, artifacts a record of an active context refers to,
// history originals no normal summary covers or a running child's grant
// names.
type Retention struct {
	ArtifactDays int `toml:"artifact_days"` // remove unpinned artifacts older than this many days; 0: keep
	ReleasesKeep int `toml:"releases_keep"` // keep this many newest releases beside the pinned ones; 0: keep all
	// HistoryDays collects the content of history originals received more
	// than this many days ago that a normal summary covers (the record, its
	// place and its coverage stay, marked collected); 0: keep.
	HistoryDays int `toml:"history_days"`
}

// Jobs is the [jobs] section: the limits of durable jobs. Each job runs in
// its own scope (tasks and CPU lower than a worker's by default), and at most
// max_concurrent at once: the root session's own cells keep their share.
// Omitted fields take their defaults (Resolved).
type Jobs struct {
	MaxConcurrent  int    `toml:"max_concurrent"`   // 1..64
	MaxWallSeconds int    `toml:"max_wall_seconds"` // per run, 1..604800
	OutputBytes    int64  `toml:"output_bytes"`     // kept of a command's output, 1..1 GiB
	MemoryMax      string `toml:"memory_max"`       // each job's scope, as limits.memory_max
	TasksMax       int    `toml:"tasks_max"`        // 1..100000
	CPUQuota       string `toml:"cpu_quota"`        // as limits.cpu_quota
}

// Resolved returns j with each omitted (zero) field at its default.
func (j Jobs) Resolved() Jobs {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&j.MaxConcurrent, DefaultJobsConcurrent)
	def(&j.MaxWallSeconds, DefaultJobsWallSeconds)
	def(&j.TasksMax, DefaultJobsTasksMax)
	if j.OutputBytes == 0 {
		j.OutputBytes = DefaultJobsOutputBytes
	}
	if j.MemoryMax == "" {
		j.MemoryMax = DefaultJobsMemoryMax
	}
	if j.CPUQuota == "" {
		j.CPUQuota = DefaultJobsCPUQuota
	}
	return j
}

// ScopeLimits returns the limits of one job's scope in [limits] form.
func (j Jobs) ScopeLimits() Limits {
	return Limits{MemoryMax: j.MemoryMax, TasksMax: j.TasksMax, CPUQuota: j.CPUQuota}
}

// Agents is the [agents] section: the bounds of a session tree, checked
// at each spawn. Omitted fields take their defaults (Resolved).
type Agents struct {
	MaxDepth       int `toml:"max_depth"`       // a root's children are at depth 1; 1..16
	MaxDescendants int `toml:"max_descendants"` // sessions under a root, finished ones included; 1..10000
	MaxConcurrent  int `toml:"max_concurrent"`  // running children of one parent; 1..64
	// MaxTreeTokens bounds the model tokens (prompt+completion) of all the
	// descendants of one root, summed; checked at spawn and before each of
	// a child's model requests. 1..10^12.
	MaxTreeTokens int64 `toml:"max_tree_tokens"`
	// MaxChildWallSeconds caps a child's wall time since its spawn (a
	// spawn's budget.wall_seconds may only ask for less). 1..31622400.
	MaxChildWallSeconds int `toml:"max_child_wall_seconds"`
	// ModelSlots bounds the model requests in flight at once of all
	// sessions; children hold at most ModelSlots-1, so one is always free
	// for a root. 2..256.
	ModelSlots int `toml:"model_slots"`
	// MaxSpawnsPerTree bounds the children spawned under one child of a
	// root (that child's whole subtree, finished ones included); it does
	// not reset. 0: none; 1..100000.
	MaxSpawnsPerTree int `toml:"max_spawns_per_tree"`
	// MaxSpawnsPerDay bounds the children spawned in a day of [spend]
	// time_zone, of all trees; it resets at midnight there. 0: none;
	// 1..100000.
	MaxSpawnsPerDay int `toml:"max_spawns_per_day"`
}

// Defaults of [agents].
const (
	DefaultAgentsMaxDepth       = 2
	DefaultAgentsMaxDescendants = 32
	DefaultAgentsMaxConcurrent  = 4
	DefaultAgentsMaxTreeTokens  = 10_000_000 // five attempts at agent.max_tokens's default
	DefaultAgentsMaxChildWall   = 3600
	DefaultAgentsModelSlots     = 4
	MaxSpawnsCap                = 100_000 // agents.max_spawns_per_tree and _per_day
)

// Resolved returns a with each omitted (zero) field at its default.
func (a Agents) Resolved() Agents {
	if a.MaxDepth == 0 {
		a.MaxDepth = DefaultAgentsMaxDepth
	}
	if a.MaxDescendants == 0 {
		a.MaxDescendants = DefaultAgentsMaxDescendants
	}
	if a.MaxConcurrent == 0 {
		a.MaxConcurrent = DefaultAgentsMaxConcurrent
	}
	if a.MaxTreeTokens == 0 {
		a.MaxTreeTokens = DefaultAgentsMaxTreeTokens
	}
	if a.MaxChildWallSeconds == 0 {
		a.MaxChildWallSeconds = DefaultAgentsMaxChildWall
	}
	if a.ModelSlots == 0 {
		a.ModelSlots = DefaultAgentsModelSlots
	}
	return a
}

// Agent is the [agent] section.
type Agent struct {
	// Route names the [routes.X] the agent's turns use. Default "main".
	Route string `toml:"route"`
	// Fallback names the routes a step goes to, in order, when the routes
	// before it fail transiently. Each names a defined route other than
	// Route, once.
	Fallback []string `toml:"fallback"`

	// Budgets of one attempt (a run of model steps started by input or a
	// wake). Exhausting one ends the attempt with a visible notice; the
	// next input starts a new one.
	MaxSteps       int `toml:"max_steps"`        // model requests per attempt
	MaxTokens      int `toml:"max_tokens"`       // prompt+completion tokens per attempt, as reported
	MaxTurnSeconds int `toml:"max_turn_seconds"` // wall time per attempt
	// MaxEmptyCompletions responses with neither text nor a tool call in a
	// row, or MaxConsecutiveErrors cells in a row that could not run, end
	// the attempt.
	MaxEmptyCompletions  int `toml:"max_empty_completions"`
	MaxConsecutiveErrors int `toml:"max_consecutive_errors"`
	// RetryBackoffMillis is the wait before a failed model request is
	// retried as a new attempt; it doubles with each failure in a row, with
	// jitter, up to MaxRetryBackoffMillis. A route that is down is retried
	// for as long as it takes: availability is not a loop guard.
	RetryBackoffMillis    int `toml:"retry_backoff_ms"`
	MaxRetryBackoffMillis int `toml:"max_retry_backoff_ms"`
	// ContextBudgetTokens bounds one request's estimated size (bytes / 4).
	// A history that does not fit pauses the session with a notice; it is
	// never silently truncated.
	ContextBudgetTokens int `toml:"context_budget_tokens"`
	// The whole request is accounted: system prompt, tool schema, every
	// message, ReserveOutputTokens for the answer and a safety margin (2 %
	// of the budget). Past CompactAt of the budget the oldest history is
	// summarized (lossless: the originals stay readable).
	ReserveOutputTokens int     `toml:"reserve_output_tokens"`
	CompactAt           float64 `toml:"compact_at"`
	// SummaryRoute names the [routes.X] summaries are written with; empty:
	// the agent's route. SummaryTimeoutSeconds bounds each summary request.
	SummaryRoute          string `toml:"summary_route"`
	SummaryTimeoutSeconds int    `toml:"summary_timeout_seconds"`
	// Host names the [hosts.X] the root session's workbench runs on (the
	// environment's KLBR_REMOTE_PLACEMENT, when set, takes precedence);
	// empty: here.
	Host string `toml:"host"`
}

// Reserve is the output reserve in force: reserve_output_tokens, but at
// most a quarter of the budget when the file leaves it at its default.
func (a Agent) Reserve() int {
	return min(a.ReserveOutputTokens, max(a.ContextBudgetTokens/4, 1))
}

// Route is a [routes.X] section: one OpenAI-compatible /chat/completions
// endpoint and how to talk to it.
type Route struct {
	URL   string `toml:"url"`   // required; http or https, with a host
	Model string `toml:"model"` // required ("" only on a seed default route: the server's own model)

	// Seed, on a seed default route only (seed.go), says what to start or
	// configure when nothing answers there; never read from the file.
	Seed string `toml:"-"`

	// The API key comes from an environment variable or a file (e.g. a
	// systemd credential), never from this file. Both are optional; at most
	// one is set.
	APIKeyEnv  string `toml:"api_key_env"`
	APIKeyFile string `toml:"api_key_file"`

	// Prompt caching is opt-in per route: CacheProfile declares which cache
	// fields the route accepts; without it none is sent.
	CacheProfile   string `toml:"cache_profile"`
	CacheAffinity  string `toml:"cache_affinity"`  // the stable cache key; only with a profile
	CacheRetention string `toml:"cache_retention"` // only where the profile accepts it

	TimeoutSeconds int `toml:"timeout_seconds"` // 1..3600, default 120

	// Dialect names the server's flavour of the API (see Dialects): which
	// request fields it accepts or requires and which response fields it
	// sends. Empty means "openai".
	Dialect string `toml:"dialect"`
	// StreamUsage, when set, overrides the dialect on sending
	// stream_options.include_usage with streaming requests.
	StreamUsage *bool `toml:"stream_usage"`
	// ReasoningReplay, when set, overrides the dialect on sending stored
	// reasoning back on assistant messages.
	ReasoningReplay *bool `toml:"reasoning_replay"`

	// ExtraOptions are added to each request body. Cache fields are removed
	// at parse time (see CacheOptionKeys) and listed in StrippedOptions.
	ExtraOptions map[string]any `toml:"extra_options"`

	// StrippedOptions are the keys Parse removed from extra_options, sorted,
	// as they were spelled, so that doctor can say so.
	StrippedOptions []string `toml:"-"`

	// Price is what the route's tokens cost (spend.go); nil: the route is
	// counted in tokens only, unless its provider reports a cost.
	Price *Price `toml:"price"`

	// Vision: the model takes images. The images of the Discord messages a
	// turn takes in are sent as image_url parts (data URLs) of their user
	// messages, bounded per request; without it only their description.
	Vision bool `toml:"vision"`
}

// Discord is the [discord] section, read by klbr-discord.
type Discord struct {
	Enabled bool `toml:"enabled"`
	// TokenFile is an absolute path; empty means
	// $CREDENTIALS_DIRECTORY/discord-token.
	TokenFile string `toml:"token_file"`
	// APIBase is the REST base URL; the gateway URL comes from
	// GET {APIBase}/gateway.
	APIBase             string   `toml:"api_base"`
	Channels            []string `toml:"channels"` // channel ids, digits only
	Ingest              string   `toml:"ingest"`   // IngestAll or IngestDirected
	AmbientWake         bool     `toml:"ambient_wake"`
	IncludeBots         bool     `toml:"include_bots"`
	AmbientBatchSeconds int      `toml:"ambient_batch_seconds"` // refused when set: see settings.toml [attention]
	PendingAgingSeconds int      `toml:"pending_aging_seconds"` // 1..86400
	// Attachment fetching: the cap of one file, of one fetch's time, the
	// fetches at once and the bytes fetched in any hour.
	AttachmentMaxBytes       int64 `toml:"attachment_max_bytes"`       // 1..500 MiB
	AttachmentTimeoutSeconds int   `toml:"attachment_timeout_seconds"` // 1..3600
	AttachmentConcurrency    int   `toml:"attachment_concurrency"`     // 1..16
	AttachmentBytesPerHour   int64 `toml:"attachment_bytes_per_hour"`  // >= attachment_max_bytes
	// AttachmentBytesPerSecond paces each fetch (0: unpaced), so that a
	// large file's copying and hashing does not take the CPU from the
	// reception of messages meanwhile.
	AttachmentBytesPerSecond int64 `toml:"attachment_bytes_per_second"` // 0, or 64 KiB..1 TiB
	// Floods: live messages past a per-author or per-channel rate are not
	// admitted; one notice per burst records them.
	AuthorBurst      int `toml:"author_burst"`       // 1..10000
	AuthorPerMinute  int `toml:"author_per_minute"`  // 1..100000
	ChannelBurst     int `toml:"channel_burst"`      // 1..10000
	ChannelPerMinute int `toml:"channel_per_minute"` // 1..100000
	// OperatorUserID is the operator's Discord user id (digits): never
	// rate-limited, and, with NotifyHeld, sent a DM with buttons for each
	// held send.
	OperatorUserID string `toml:"operator_user_id"`
	NotifyHeld     bool   `toml:"notify_held"`
}

// Limits is the [limits] section: the resource limits of worker scopes, in
// systemd's notation.
type Limits struct {
	MemoryMax string `toml:"memory_max"` // digits with an optional K, M, G or T suffix (base 1024)
	TasksMax  int    `toml:"tasks_max"`  // 1..100000
	CPUQuota  string `toml:"cpu_quota"`  // digits followed by %
}

// Browser is the [browser] section: the browser client's login.
type Browser struct {
	// CookieDays is how long the login cookie set by ?token= lasts
	// (Max-Age), 1..3650 days; `klbr-core open --rotate` ends it sooner.
	CookieDays int `toml:"cookie_days"`
}

// CookieMaxAge is the login cookie's lifetime (the default when unset).
func (b Browser) CookieMaxAge() time.Duration {
	d := b.CookieDays
	if d <= 0 {
		d = DefaultCookieDays
	}
	return time.Duration(d) * 24 * time.Hour
}

// Cache profiles: the values cache_profile accepts.
const (
	CacheProfilePromptCacheKey       = "openai_prompt_cache_key"
	CacheProfilePromptCacheRetention = "openai_prompt_cache_retention"
	CacheProfilePromptCacheOptions   = "openai_prompt_cache_options"
)

// Dialects: the values dialect accepts.
const (
	DialectOpenAI     = "openai"
	DialectDeepSeek   = "deepseek"
	DialectMistral    = "mistral"
	DialectLlamaCpp   = "llama.cpp"
	DialectVLLM       = "vllm"
	DialectOllama     = "ollama"
	DialectOpenRouter = "openrouter"
)

// Dialects returns the dialect names, the default first.
func Dialects() []string {
	return []string{DialectOpenAI, DialectDeepSeek, DialectMistral, DialectLlamaCpp, DialectVLLM, DialectOllama, DialectOpenRouter}
}

// Ingest modes: the values discord.ingest accepts.
const (
	IngestAll      = "all"
	IngestDirected = "directed"
)

// Defaults of the fields the file leaves out.
// DefaultAttachmentBytesPerSecond paces one attachment fetch: 16 MiB/s, a
// 25 MiB file in about 1.6 s (docs/performance.md: a DM's reception during
// a fetch).
const DefaultAttachmentBytesPerSecond = 16 << 20

const (
	DefaultAgentRoute          = "main"
	DefaultMaxSteps            = 40
	DefaultMaxTokens           = 2000000
	DefaultMaxTurnSeconds      = 3600
	DefaultMaxEmpty            = 3
	DefaultMaxErrors           = 3
	DefaultRetryBackoffMillis  = 2000
	DefaultReserveOutput       = 4096
	DefaultCompactAt           = 0.75
	DefaultSummaryTimeout      = 120
	DefaultMaxRetryBackoff     = 5 * 60 * 1000
	DefaultContextBudget       = 100000
	DefaultRouteTimeoutSeconds = 120
	DefaultDiscordAPIBase      = "https://discord.com/api/v9"
	DefaultPendingAgingSeconds = 600
	DefaultMemoryMax           = "2G"
	DefaultTasksMax            = 256
	DefaultCPUQuota            = "200%"
	DefaultJobsConcurrent      = 4
	DefaultJobsWallSeconds     = 86400
	DefaultJobsOutputBytes     = 16 << 20
	DefaultJobsMemoryMax       = "2G"
	DefaultJobsTasksMax        = 128
	DefaultJobsCPUQuota        = "100%"
	DefaultCookieDays          = 30
	maxCookieDays              = 3650
)

// Defaults returns the File an empty klbr.toml means.
func Defaults() File {
	return File{
		Agent: Agent{Route: DefaultAgentRoute, MaxSteps: DefaultMaxSteps, MaxTokens: DefaultMaxTokens,
			MaxTurnSeconds: DefaultMaxTurnSeconds, MaxEmptyCompletions: DefaultMaxEmpty,
			MaxConsecutiveErrors: DefaultMaxErrors, ContextBudgetTokens: DefaultContextBudget,
			RetryBackoffMillis: DefaultRetryBackoffMillis, MaxRetryBackoffMillis: DefaultMaxRetryBackoff,
			ReserveOutputTokens: DefaultReserveOutput, CompactAt: DefaultCompactAt, SummaryTimeoutSeconds: DefaultSummaryTimeout},
		Discord: Discord{
			APIBase:                  DefaultDiscordAPIBase,
			Ingest:                   IngestAll,
			AmbientWake:              true,
			PendingAgingSeconds:      DefaultPendingAgingSeconds,
			AttachmentMaxBytes:       25 << 20,
			AttachmentTimeoutSeconds: 60,
			AttachmentConcurrency:    2,
			AttachmentBytesPerHour:   1 << 30,
			AttachmentBytesPerSecond: DefaultAttachmentBytesPerSecond,
			AuthorBurst:              20,
			AuthorPerMinute:          30,
			ChannelBurst:             60,
			ChannelPerMinute:         120,
		},
		Limits: Limits{
			MemoryMax: DefaultMemoryMax,
			TasksMax:  DefaultTasksMax,
			CPUQuota:  DefaultCPUQuota,
		},
		Browser: Browser{CookieDays: DefaultCookieDays},
		Storage: Storage{WarnAt: DefaultStorageWarnAt},
	}
}

// CacheOptionKeys returns the request fields that only a cache profile may
// set. Parse removes them from extra_options (compared case-insensitively,
// since some servers match JSON fields that way).
func CacheOptionKeys() []string {
	return []string{"cache_prompt", "cache_control", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"}
}

// StepRoutes returns the agent's route followed by its fallbacks: the
// default order in which a step tries routes.
func (f *File) StepRoutes() []string {
	return append([]string{f.Agent.Route}, f.Agent.Fallback...)
}

// AgentRoute returns the route the agent's turns use, and whether the file
// defines it.
func (f *File) AgentRoute() (Route, bool) {
	r, ok := f.Routes[f.Agent.Route]
	return r, ok
}

// Parse decodes and validates the TOML text of a klbr.toml. name is the
// file name used in errors. Omitted fields get their defaults, cache fields
// are stripped from extra_options, and every error is an *Error with the
// line of the key it is about (several are joined; see Errors).
func Parse(name string, data []byte) (File, error) {
	f := Defaults()
	var errs []*Error
	if err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(&f); err != nil {
		decErrs, fatal := decodeErrors(name, err)
		if fatal {
			return File{}, joinErrors(decErrs)
		}
		errs = append(errs, decErrs...)
	}
	index, keyErrs := indexKeys(name, data, reflect.TypeFor[File]())
	for _, e := range errs {
		// go-toml names a key inside an inline table without the table.
		e.Key = index.qualify(position{e.Line, e.Column}, e.Key)
		if near, ok := index.near[e.Key]; ok && e.Msg == "unknown key" {
			e.Msg += " (did you mean " + strconv.Quote(near) + "?)"
		}
	}
	errs = append(errs, keyErrs...)

	for id, r := range f.Routes {
		if !index.has(formatKey("routes", id, "timeout_seconds")) {
			r.TimeoutSeconds = DefaultRouteTimeoutSeconds
		}
		r.StrippedOptions = stripCacheOptions(r.ExtraOptions)
		f.Routes[id] = r
	}

	errs = append(errs, validate(name, index, &f)...)
	if err := joinErrors(errs); err != nil {
		return File{}, err
	}
	return f, nil
}

// stripCacheOptions deletes the cache fields from options and returns the
// deleted keys, sorted.
func stripCacheOptions(options map[string]any) []string {
	var stripped []string
	for k := range options {
		if isCacheOptionKey(k) {
			stripped = append(stripped, k)
			delete(options, k)
		}
	}
	slices.Sort(stripped)
	return stripped
}

// isCacheOptionKey reports whether k is one of CacheOptionKeys, ignoring case.
func isCacheOptionKey(k string) bool {
	return slices.ContainsFunc(CacheOptionKeys(), func(c string) bool { return strings.EqualFold(c, k) })
}
