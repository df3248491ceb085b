package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Slots of history.
const (
	SlotCompactionPlan = "compaction.plan"
	SlotSummaryPrepare = "summary.prepare"
)

// hookDeadline bounds the history hooks (compaction runs between steps).
const hookDeadline = 500 * time.Millisecond

// CompactionCandidate is an eligible run the host could compact.
type CompactionCandidate struct {
	Index     int     `json:"index"`
	Entries   int     `json:"entries"`
	Units     int     `json:"units"`
	Tokens    int     `json:"tokens"`
	Summaries int     `json:"summaries"` // earlier summaries in the run
	FirstAt   float64 `json:"first_at"`  // unix seconds
	LastAt    float64 `json:"last_at"`
}

// CompactionInput is what compaction.plan sees.
type CompactionInput struct {
	Reason     string                `json:"reason"` // threshold, budget (over the hard budget), operator
	Need       int                   `json:"need"`   // estimated tokens of the next request
	Threshold  int                   `json:"threshold"`
	Budget     int                   `json:"budget"`
	CompactAt  float64               `json:"compact_at"`
	Candidates []CompactionCandidate `json:"candidates"` // oldest first; the host's default is 0
}

// CompactionPlan is compaction.plan's answer as the host applies it.
type CompactionPlan struct {
	// Choose is the candidate to compact; -1: none now (refused on the
	// hard-budget path, where the host takes the oldest).
	Choose int
	// CompactAt, when set, lowers this session's threshold from now on
	// (compact earlier); the host keeps it within [0.1, agent.compact_at].
	CompactAt float64
	Reason    string
	Fallback  bool
}

// PlanCompaction runs compaction.plan and validates its answer. An
// unavailable, failing or nonsensical hook gets the host default: the
// oldest candidate.
func (d *Dispatcher) PlanCompaction(ctx context.Context, session string, in CompactionInput) CompactionPlan {
	c := d.invoke(ctx, session, SlotCompactionPlan, in, hookDeadline)
	p, problem := CompactionPlan{Choose: 0}, ""
	if c.rec.Outcome != "ok" {
		problem = fmt.Sprintf("compaction.plan %s: %s", c.rec.Outcome, c.rec.Error)
	} else if p2, err := decodeCompactionPlan(in, c.result); err != nil {
		problem, c.rec.Outcome = err.Error(), "invalid"
	} else {
		p = p2
	}
	if problem != "" {
		p = CompactionPlan{Choose: 0, Fallback: true, Reason: "host default (" + problem + ")"}
		c.rec.Error = problem
	}
	c.rec.Fallback = p.Fallback
	d.finish(c)
	return p
}

func decodeCompactionPlan(in CompactionInput, out json.RawMessage) (CompactionPlan, error) {
	var r struct {
		Choose    *int     `json:"choose"`
		CompactAt *float64 `json:"compact_at"`
		Reason    string   `json:"reason"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return CompactionPlan{}, fmt.Errorf("compaction.plan answered %s, not {choose, compact_at, reason}", truncate(out))
	}
	p := CompactionPlan{Choose: -1, Reason: r.Reason}
	if r.Choose != nil {
		if *r.Choose < 0 || *r.Choose >= len(in.Candidates) {
			return p, fmt.Errorf("compaction.plan chose candidate %d of %d", *r.Choose, len(in.Candidates))
		}
		p.Choose = *r.Choose
	}
	if p.Choose < 0 && in.Reason == "budget" {
		return p, fmt.Errorf("compaction.plan declined to compact over the hard budget (%d of %d tokens)", in.Need, in.Budget)
	}
	if r.CompactAt != nil {
		if *r.CompactAt < 0.1 || *r.CompactAt > in.CompactAt {
			return p, fmt.Errorf("compaction.plan asked for compact_at %v, outside [0.1, %v]", *r.CompactAt, in.CompactAt)
		}
		p.CompactAt = *r.CompactAt
	}
	return p, nil
}

// PrepareInput is what summary.prepare sees.
type PrepareInput struct {
	Prompt      string `json:"prompt"`
	SourceBytes int    `json:"source_bytes"`
	Entries     int    `json:"entries"`
	Depth       int    `json:"depth"`
}

// maxPrompt bounds a prepared summary prompt.
const maxPrompt = 64 << 10

// PrepareSummary runs summary.prepare: the prompt it returns, or the
// prompt it was given when the hook is unavailable or answers nonsense.
func (d *Dispatcher) PrepareSummary(ctx context.Context, session string, in PrepareInput) string {
	c := d.invoke(ctx, session, SlotSummaryPrepare, in, hookDeadline)
	prompt, problem := in.Prompt, ""
	if c.rec.Outcome != "ok" {
		problem = fmt.Sprintf("summary.prepare %s: %s", c.rec.Outcome, c.rec.Error)
	} else {
		var r struct {
			Prompt *string `json:"prompt"`
		}
		switch err := json.Unmarshal(c.result, &r); {
		case err != nil || r.Prompt == nil:
			problem = fmt.Sprintf("summary.prepare answered %s, not {prompt}", truncate(c.result))
		case *r.Prompt == "" || len(*r.Prompt) > maxPrompt || !utf8.ValidString(*r.Prompt):
			problem = fmt.Sprintf("summary.prepare returned a prompt of %d bytes (1..%d of UTF-8)", len(*r.Prompt), maxPrompt)
		default:
			prompt = *r.Prompt
		}
		if problem != "" {
			c.rec.Outcome = "invalid"
		}
	}
	if problem != "" {
		c.rec.Error, c.rec.Fallback = problem, true
	}
	d.finish(c)
	return prompt
}
