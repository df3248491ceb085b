// Package api holds the wire types of the operator API (control.sock): what
// the server in package localapi answers and the client in package
// localclient sends. Version 1 lives under /v1.
package api

import (
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/diskuse"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// Version is the operator API's path prefix.
const Version = "/v1"

// MaxRequestBytes bounds every request body the operator API accepts.
const MaxRequestBytes = 128 << 10

// SendRequest is an operator input.
type SendRequest struct {
	Text string `json:"text"`
	// SourceKey makes a retry idempotent: the same key in the same session is
	// the same input. The CLI generates one per invocation.
	SourceKey  string     `json:"source_key"`
	OccurredAt *time.Time `json:"occurred_at,omitempty"`
	// Maintenance makes the input a maintenance goal: the turn attending it
	// carries the maintenance skill (klbr-core maintain; the browser may set it).
	Maintenance bool `json:"maintenance,omitempty"`
}

// SendResponse is the receipt of a committed input.
type SendResponse struct {
	Session   string `json:"session"`
	ID        int64  `json:"id"`
	EventID   int64  `json:"event_id"`
	Duplicate bool   `json:"duplicate"`
	// Unanswered says why the input will not be answered yet (a stopped or
	// paused session waits for start); empty otherwise.
	Unanswered string `json:"unanswered,omitempty"`
}

// Status is the daemon's state.
type Status struct {
	Version   string    `json:"version"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	DataDir   string    `json:"data_dir"`
	Draining  bool      `json:"draining"`
	SQLite    string    `json:"sqlite_version"`
	Placement string    `json:"placement"`
	// PlacementNotes says why earlier placement modes were skipped, and
	// Workbench whether cells can run at all (and if not, why).
	PlacementNotes []string `json:"placement_notes,omitempty"`
	// Sandbox says in one line what the workers run under here (Landlock
	// ABI, uid, capabilities) and whether it is weaker than it could be;
	// SandboxDetail is the paragraph: what is not enforced and what to do
	// (doctor --verbose). Empty when no workbench runs.
	Sandbox       string `json:"sandbox,omitempty"`
	SandboxDetail string `json:"sandbox_detail,omitempty"`
	Workbench     string `json:"workbench"`
	// WorkbenchHost names the worker host the root session's workbench runs on
	// (KLBR_REMOTE_PLACEMENT, [agent] host); empty: here.
	WorkbenchHost string `json:"workbench_host,omitempty"`
	// WorkbenchLost is, by session, the last generation on the host that
	// was lost unasked (its SSH session ended) and why: its Python state is
	// gone and the next cell started a new generation.
	WorkbenchLost []workbench.Lost `json:"workbench_lost,omitempty"`
	// Agent says whether the turn loop runs: "route <name> (<model>)", or
	// why not (no route configured, cells cannot run).
	Agent string `json:"agent"`
	// Config is the klbr.toml in force: read at the start or at the last
	// reload that was not refused.
	Config ConfigInForce `json:"config"`
	// Storage is set while writes fail (a full disk, an I/O error, a
	// read-only file system): new work waits until they succeed again.
	Storage *store.Fault `json:"storage,omitempty"`
	// Routes are the model routes of the agent's plan, with the ones
	// resting after a transient failure (their steps go to the next route
	// of the plan until the rest ends, then they are tried first again).
	Routes []RouteStatus `json:"routes,omitempty"`
	// Sizes are the data directory's bytes by part (database, WAL,
	// artifacts, releases); Schema its schema version and whether the
	// previous binary could still run on it.
	Sizes store.StorageSizes `json:"sizes"`
	// Usage is the data directory against [storage] max_bytes: usage,
	// the bound and the headroom.
	Usage    diskuse.Usage      `json:"usage"`
	Schema   store.SchemaStatus `json:"schema"`
	Sessions []SessionStatus    `json:"sessions"`
	// Held counts the Discord sends and reactions delivery.review held that
	// wait for the operator (klbr-core held, release, drop).
	Held int64 `json:"held"`
	// HeldSince is when the oldest of them was held: they wait for a person,
	// and only a decision (release or drop) ends the wait.
	HeldSince *time.Time `json:"held_since,omitempty"`
	// Jobs are the durable jobs running now and the scheduler's next wake-up.
	Jobs *JobsStatus `json:"jobs,omitempty"`
	// Spend is today's and this month's spend against the caps, and the
	// sessions held at one; nil when the agent does not run.
	Spend *spend.State `json:"spend,omitempty"`
	// PromptCache is each route's prompt cache hit ratio today.
	PromptCache []PromptCache `json:"prompt_cache,omitempty"`
	// Hooks is the hooks' diagnostics (nil when no hook worker can run).
	Hooks *HooksStatus `json:"hooks,omitempty"`
}

// JobsStatus is the jobs part of status.
type JobsStatus struct {
	Running    []store.Job `json:"running"`
	NextWakeup *time.Time  `json:"next_wakeup,omitempty"`
	// Hosts are the worker hosts as klbr-core last reached them (none
	// without [hosts]).
	Hosts []hosts.Status `json:"hosts,omitempty"`
}

// Jobs is a job listing (GET /v1/jobs).
type Jobs struct {
	Jobs []store.Job `json:"jobs"`
}

// RouteStatus is one model route's state.
type RouteStatus struct {
	Name string `json:"name"`
	// RestingSeconds is how much longer the route rests; 0 when in use.
	RestingSeconds float64 `json:"resting_seconds"`
}

// Browser is where the running daemon's browser UI is, with the operator
// token (GET /v1/browser): secret, for the operator only.
type Browser struct {
	URL string `json:"url"`
}

// SessionStatus is one session's state and backlog.
type SessionStatus struct {
	store.Session
	Pending  int64 `json:"pending"`
	Draining bool  `json:"draining"`
	// The current or last attempt, and the armed wait with its deadline.
	store.TurnStatus
	// Retry is set while the session retries a failed model request or
	// backs off after a rejected one or a loop guard.
	Retry *turn.Retry `json:"retry,omitempty"`
	// Context is the session's active context and its accounting.
	Context *ContextStatus `json:"context,omitempty"`
}

// ContextStatus is a session's active context (entries, summaries, its
// version) and, while the agent runs, the last request's estimate against
// the budget: the numbers /metrics shows.
type ContextStatus struct {
	store.ContextStats
	*turn.ContextState
}

// ConfigInForce is the klbr.toml a running daemon read last.
type ConfigInForce struct {
	Path string `json:"path"`
	// Digest is the hex SHA-256 of the bytes read; empty: no file was
	// there (the defaults apply).
	Digest string    `json:"digest"`
	ReadAt time.Time `json:"read_at"`
}

// Compacted is a manual compaction's result.
type Compacted struct {
	Session  string `json:"session"`
	Summary  string `json:"summary"` // its ref, s<id>
	Kind     string `json:"kind"`    // normal, or degraded (a host stub)
	Attempts int    `json:"attempts"`
	// TokensBefore and TokensAfter are the context's estimated size
	// before and after: the measure Message, tail and the browser show.
	TokensBefore int `json:"tokens_before"`
	TokensAfter  int `json:"tokens_after"`
	// SourceTokens and SummaryTokens are the run replaced and its summary.
	SourceTokens  int      `json:"source_tokens"`
	SummaryTokens int      `json:"summary_tokens"`
	Problems      []string `json:"problems,omitempty"`
	Message       string   `json:"message"`
}

// NewCompacted describes a committed compaction for the operator.
func NewCompacted(session string, res history.Result) Compacted {
	ref := store.SummaryRef(res.Summary)
	msg := fmt.Sprintf("compacted: summary %s (%s); %s", ref, res.Kind, history.Measure(res.Before, res.After))
	if res.Kind == store.SummaryDegraded && len(res.Problems) > 0 {
		msg += "; the summarizer could not be used: " + res.Problems[len(res.Problems)-1]
	}
	return Compacted{Session: session, Summary: ref, Kind: res.Kind, Attempts: res.Attempts, TokensBefore: res.Before, TokensAfter: res.After, SourceTokens: res.Source,
		SummaryTokens: res.Tokens, Problems: res.Problems, Message: msg}
}

// ExecRequest runs a cell in a session's workbench.
type ExecRequest struct {
	Code           string  `json:"code"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"` // default 60; the cell is interrupted after it
}

// ResetRequest resets a session's context: a new context epoch, the
// archive kept, durable work untouched. Kernel also restarts its workbench
// (Python state is not restored).
type ResetRequest struct {
	Reason string `json:"reason,omitempty"`
	Kernel bool   `json:"kernel,omitempty"`
}

// PublishRequest publishes the behavior tree at Path (absolute, on the
// daemon's machine) as an immutable release.
type PublishRequest struct {
	Path string `json:"path"`
}

// ActivateRequest activates a release for a session. ExpectedEpoch is the
// session's current behavior epoch as the operator saw it (compare-and-swap);
// Release is a release id or its directory under <data>/releases.
type ActivateRequest struct {
	ExpectedEpoch int64  `json:"expected_epoch"`
	Release       string `json:"release"`
	Reason        string `json:"reason,omitempty"`
}

// Releases lists the recorded releases and each session's behavior.
type Releases struct {
	Releases []Release         `json:"releases"`
	Sessions []SessionBehavior `json:"sessions"`
}

// Release is one recorded release.
type Release struct {
	ID         string              `json:"id"`
	Path       string              `json:"path"`
	Files      int                 `json:"files"`
	Skills     []string            `json:"skills"`
	Components behavior.Components `json:"components"`
	Problem    string              `json:"problem,omitempty"` // set when it no longer verifies
	// Validation is the host's newest validation report of the release
	// (any session); nil when it was never validated.
	Validation *store.Validation `json:"validation,omitempty"`
}

// SessionBehavior is a session's active epoch and its history.
type SessionBehavior struct {
	Session string             `json:"session"`
	Epoch   int64              `json:"epoch"`
	Release string             `json:"release"`
	History []store.Activation `json:"history"`
}

// Records is one page of a session's durable records. More is set when the
// page was full and more records may follow its last seq.
type Records struct {
	Records []store.Record `json:"records"`
	More    bool           `json:"more"`
}

// Items is a listing of attention items.
type Items struct {
	Items []store.AttentionItem `json:"items"`
}

// MarkRequest is an operator's decision on an attention item: status
// pending (reopen), seen, acted or ignored, and why.
type MarkRequest struct {
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

// Held is a listing of the Discord sends and reactions delivery.review
// held, waiting for the operator, oldest first.
type Held struct {
	Effects []store.Effect `json:"effects"`
}

// DecideRequest is the operator's release or drop of a held effect; Note
// says why, for the record.
type DecideRequest struct {
	Note string `json:"note,omitempty"`
}

// Accepted answers a request that the daemon carries out after answering,
// such as a daemon drain.
type Accepted struct {
	Accepted bool   `json:"accepted"`
	Message  string `json:"message"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong, in a stable code and an operator-facing message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeInvalid          = "invalid"     // 400: malformed or out-of-bounds request
	CodeTooLarge         = "too_large"   // 413
	CodeForbidden        = "forbidden"   // 403: wrong peer or authority
	CodeNotFound         = "not_found"   // 404: unknown session or path
	CodeConflict         = "conflict"    // 409: stopped, illegal transition, concurrent change
	CodeDraining         = "draining"    // 503: admission closed
	CodeInternal         = "internal"    // 500
	CodeUnavailable      = "unavailable" // 503: a part the request needs cannot run (no Python, no kernel)
	CodeRefused          = "refused"     // 422: a candidate release failed its check
	CodeMethodNotAllowed = "method_not_allowed"
	CodeNotImplemented   = "not_implemented" // 501: the operation is not available yet
	CodeCursorPastEnd    = "cursor_past_end" // 409: a records cursor past the session's last record
)

// PromptCache is a route's prompt cache today (in [spend] time_zone), from
// the spend ledger: the prompt tokens its requests sent and the part the
// provider reported as read from its cache.
type PromptCache struct {
	Route    string  `json:"route"`
	Prompt   int64   `json:"prompt_tokens"`
	Cached   int64   `json:"cache_read_tokens"`
	HitRatio float64 `json:"hit_ratio"`
}
