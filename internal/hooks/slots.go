package hooks

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/klbr-dev/klbr/internal/jobs"
)

// Kind is how a slot is bound and called.
type Kind string

// Slot kinds: a decision has one handler whose answer the host validates
// (or replaces by its default); a transform is an ordered chain of handlers,
// each given the previous one's output; an observer reacts to committed
// events, durably, with state and proposed commands.
const (
	KindDecision  Kind = "decision"
	KindTransform Kind = "transform"
	KindObserver  Kind = "observer"
)

// Slot describes one slot: what it is given, what it answers, its deadline,
// what happens when it fails and the host's default. It is the one registry
// every part of klbr reads (hooks.list, hooks.describe, hooks.test, the
// candidate check, diagnostics).
type Slot struct {
	Name     string        `json:"slot"`
	Kind     Kind          `json:"kind"`
	Doc      string        `json:"doc"`
	Input    string        `json:"input"`
	Output   string        `json:"output"`
	Deadline time.Duration `json:"-"`
	// DeadlineMS is Deadline in milliseconds, for the SDK.
	DeadlineMS int64  `json:"deadline_ms"`
	Failure    string `json:"failure"`
	Default    string `json:"default"`
	// Optional slots may be absent from a release's SLOTS: the host's
	// default applies without a round trip. Required slots (attention.plan,
	// delivery.review) are checked at every activation.
	Optional bool `json:"optional"`
	// Fixture is an input the candidate check and hooks.test may use.
	Fixture any `json:"example_input,omitempty"`
}

// Slot names beyond those of plan.go, review.go, modelplan.go, compaction.go.
const (
	SlotTurnPrepare     = "turn.prepare"
	SlotTurnNext        = "turn.next"
	SlotExecutionReview = "execution.review"

	SlotContextPrepare  = "context.prepare"
	SlotDeliveryPrepare = "delivery.prepare"
	SlotResultPresent   = "result.present"

	ObserveInputAccepted     = "input.accepted"
	ObserveDeliveryReceipt   = "delivery.receipt"
	ObserveTurnCompleted     = "turn.completed"
	ObserveRevisionActivated = "revision.activated"
	ObserveJobCompleted      = "job.completed"
	ObserveChildCompleted    = "child.completed"
	ObserveChildFailed       = "child.failed"
)

const (
	decisionDeadline  = 500 * time.Millisecond
	transformDeadline = 500 * time.Millisecond
	observerDeadline  = 2 * time.Second
)

var registry = []Slot{
	{Name: SlotPlan, Kind: KindDecision, Deadline: decisionDeadline,
		Doc:     "Orders the inputs waiting for attention. Operator input first; DMs and mentions before ambient chatter; ambient items may be deferred.",
		Input:   `{"items":[{"id","source_kind","directed","conversation","received_at"}],"now"}`,
		Output:  `{"order":[ids],"defer":[{"id","until"}],"reason"}`,
		Failure: "falls back: an error, timeout or a plan that loses, doubles, defers or demotes operator input gets the host default",
		Default: "operator first, oldest first; then DMs and mentions; ambient after 8 s; conversations take turns",
		Fixture: PlanInput{Items: []PlanItem{{ID: 1, SourceKind: "operator", Conversation: "operator", ReceivedAt: 1}}, Now: 2}},
	{Name: SlotReview, Kind: KindDecision, Deadline: time.Second,
		Doc:     "Reviews an explicit send before it is delivered.",
		Input:   `{"channel":"local"|"discord","text","destination","session","frame"}`,
		Output:  `{"decision":"allow"|"hold","reason"}`,
		Failure: "fails closed: anything but a well-formed decision holds the send",
		Default: "hold (there is no allowing default)",
		Fixture: ReviewInput{Channel: "local", Text: "candidate check", Session: "check"}},
	{Name: SlotModelPlan, Kind: KindDecision, Deadline: decisionDeadline, Optional: true,
		Doc:     "Picks the model routes a step tries, in order.",
		Input:   `{"session","purpose","directed","routes":[{"name","model","dialect","down"}],"default":[names]}`,
		Output:  `{"routes":[1..8 configured names],"reason"}`,
		Failure: "falls back to the default plan",
		Default: "agent.route, then agent.fallback"},
	{Name: SlotCompactionPlan, Kind: KindDecision, Deadline: hookDeadline, Optional: true,
		Doc:     "Chooses which eligible run of history to compact.",
		Input:   `{"reason","need","threshold","budget","compact_at","candidates":[...]}`,
		Output:  `{"choose":index|null,"compact_at"?,"reason"}`,
		Failure: "falls back to the oldest candidate",
		Default: "the oldest eligible run"},
	{Name: SlotSummaryPrepare, Kind: KindDecision, Deadline: hookDeadline, Optional: true,
		Doc:     "Adjusts the summary prompt before a summary request.",
		Input:   `{"prompt","source_bytes","entries","depth"}`,
		Output:  `{"prompt"}`,
		Failure: "falls back to the prompt it was given",
		Default: "the release's prompts/summary.md"},
	{Name: SlotJobPlan, Kind: KindDecision, Deadline: decisionDeadline, Optional: true,
		Doc:     "Admits a new job (jobs.run, jobs.schedule) or child agent (agents.spawn) or refuses it, and gives its priority among jobs due at once.",
		Input:   `{"kind":"command"|"routine"|"source"|"child","spec":{...} (a child's: task, refs, profile, workspace, budget, delegate, depth),"schedule"?:{...},"recovery","running":n}`,
		Output:  `{"admit":bool,"priority":-100..100,"reason"}`,
		Failure: "falls back: admitted at priority 0",
		Default: "admitted at priority 0",
		Fixture: jobs.PlanInput{Kind: "command", Spec: json.RawMessage(`{"argv":["true"]}`), Recovery: "manual"}},
	{Name: SlotTurnPrepare, Kind: KindDecision, Deadline: decisionDeadline, Optional: true,
		Doc:     "Before an attempt starts: start now, defer (bounded; never with operator input), or start with extra guidance the model sees.",
		Input:   `{"session","wake","inputs":[{"id","source_kind","directed","conversation"}],"deferred":n}`,
		Output:  `{"decision":"start"|"defer","seconds"?:0<s<=` + "300" + `,"guidance"?:str<=4000 bytes,"reason"}`,
		Failure: "falls back: start now without guidance",
		Default: "start now, no guidance",
		Fixture: PrepareTurnInput{Session: "check", Wake: "input", Inputs: []TurnInputRef{{ID: 1, SourceKind: "operator", Conversation: "operator"}}}},
	{Name: SlotTurnNext, Kind: KindDecision, Deadline: decisionDeadline, Optional: true,
		Doc:     "After each step that ran cells: continue, wait or end. The host enforces the budgets whatever it says.",
		Input:   `{"session","attempt","steps","tokens","elapsed_seconds","calls","pending","budgets":{"max_steps","max_tokens","max_turn_seconds"}}`,
		Output:  `{"decision":"continue"|"wait"|"end","seconds"?:0<s<=600 (wait),"reason"}`,
		Failure: "falls back: continue",
		Default: "continue (the model decides when to wait or end)",
		Fixture: NextInput{Session: "check", Attempt: 1, Steps: 1, Calls: 1}},
	{Name: SlotExecutionReview, Kind: KindDecision, Deadline: decisionDeadline, Optional: true,
		Doc:     "Before a cell runs: allow or hold it. A held cell never runs; the model sees a held result with the reason.",
		Input:   `{"session","code","call","step","attempt"}`,
		Output:  `{"decision":"allow"|"hold","reason"}`,
		Failure: "falls back to allow, unless the release lists it in [hooks] required: then it fails closed (holds)",
		Default: "allow",
		Fixture: ExecutionInput{Session: "check", Code: "1 + 1", Call: "call_check"}},
	{Name: SlotContextPrepare, Kind: KindTransform, Deadline: transformDeadline, Optional: true,
		Doc:     "Bounded additions to the next model request (reminders, notes, history refs). It never removes records or authority labels.",
		Input:   `{"session","attempt","step","additions":[str]}`,
		Output:  `{"additions":[str]} (each <= 4000 bytes, at most 8; earlier additions are kept)`,
		Failure: "the failing handler is skipped: the chain goes on with the previous output",
		Default: "no additions",
		Fixture: ContextInput{Session: "check", Step: 1, Additions: []string{}}},
	{Name: SlotDeliveryPrepare, Kind: KindTransform, Deadline: transformDeadline, Optional: true,
		Doc:     "Shapes outgoing text before review: split it into several sends (one receipt each), tidy mentions. It cannot change the destination.",
		Input:   `{"channel","destination","session","limit","parts":[str]}`,
		Output:  `{"parts":[str]} (1..16 parts, each 1..limit bytes of UTF-8)`,
		Failure: "the failing handler is skipped: the chain goes on with the previous output",
		Default: "the text as it is, one send",
		Fixture: DeliveryInput{Channel: "local", Session: "check", Limit: 2000, Parts: []string{"candidate check"}}},
	{Name: SlotResultPresent, Kind: KindTransform, Deadline: transformDeadline, Optional: true,
		Doc:     "How a cell's result is shown to the model (previews, artifact refs). The complete result is stored regardless.",
		Input:   `{"session","status","text"}`,
		Output:  `{"text"} (<= 64 KiB of UTF-8)`,
		Failure: "the failing handler is skipped: the chain goes on with the previous output",
		Default: "the host's rendering of the outcome",
		Fixture: PresentInput{Session: "check", Status: "ok", Text: "2"}},
	{Name: ObserveInputAccepted, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc: "Called durably for each admitted input.", Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveDeliveryReceipt, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc: "Called durably for each receipt: local confirmed or held, Discord confirmed, failed or unknown.", Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveTurnCompleted, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc: "Called durably when an attempt ends.", Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveRevisionActivated, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc: "Called durably when a behavior release is activated.", Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveJobCompleted, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc:   "Called durably when a job's run ends: its state (succeeded, failed, cancelled, unknown; pending when a recurring job's run ended and it waits for its next deadline), run, error, result (up to 4 KiB), output preview and artifact.",
		Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveChildCompleted, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc:   "Called durably in the parent's session when a child agent succeeds: its job, child session, result (up to 4 KiB) and whether the result is implicit (the child ended its turn without agents.finish).",
		Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
	{Name: ObserveChildFailed, Kind: KindObserver, Deadline: observerDeadline, Optional: true,
		Doc:   "Called durably in the parent's session when a child agent ends without success: failed, cancelled or unknown, with its error.",
		Input: observerIn, Output: observerOut, Failure: observerFailure, Default: "no observer bound"},
}

const (
	observerIn      = `{"event":{"id","kind","session","depth","data":{...}},"state":{...}}`
	observerOut     = `{"state"?:{...} (<= 64 KiB JSON),"commands"?:[{"op":"local.send"|"discord.send"|"discord.react"|"discord.mark"|"runtime.wakeup","args":{...}}] (<= 8)}; the answer is the acknowledgement`
	observerFailure = "retried with backoff (1 s doubling to 5 min) up to 8 times, then dead-lettered with a visible notice; commands of a retried delivery are never minted twice"
)

func init() {
	for i := range registry {
		registry[i].DeadlineMS = registry[i].Deadline.Milliseconds()
	}
}

// Slots returns every slot, by name.
func Slots() []Slot {
	out := append([]Slot(nil), registry...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup returns the slot named name.
func Lookup(name string) (Slot, bool) {
	for _, s := range registry {
		if s.Name == name {
			return s, true
		}
	}
	return Slot{}, false
}

// SlotNames lists every slot's name, sorted.
func SlotNames() []string {
	var out []string
	for _, s := range Slots() {
		out = append(out, s.Name)
	}
	return out
}
