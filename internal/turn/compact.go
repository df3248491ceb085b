package turn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/tracing"
)

// Context budget: the whole request (system prompt, tool schema, every
// message), the reserved output and a safety margin must fit
// ContextTokens. Past CompactAt of it, the oldest eligible run of complete
// groups is compacted, synchronously, between steps; when nothing eligible
// is left and the request still does not fit, the session pauses with the
// sizes named. Never a truncation, never a loop.

// maxRounds bounds the compactions of one step boundary. Each one strictly
// reduces the context, so this is a backstop, not the way out.
const maxRounds = 16

// Estimator turns request bytes into tokens for one route: bytes/4, scaled
// by the largest ratio of reported prompt tokens to that estimate among the
// route's recent requests (never trusting bytes/4 alone).
type Estimator struct {
	mu     sync.Mutex
	ratios []float64 // guarded by mu: the most recent last
}

const calibrationWindow = 8

// Raw is the uncalibrated estimate (what model_steps.estimated_tokens keeps).
func Raw(bytes int) int { return (bytes + 3) / 4 }

// Tokens estimates bytes as tokens of this route.
func (e *Estimator) Tokens(bytes int) int {
	return int(float64(Raw(bytes))*e.Factor() + 0.5)
}

// Factor is the calibration factor in force: 1 until the route reported
// usage, then the largest recent ratio, within [0.5, 4].
func (e *Estimator) Factor() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ratios) == 0 {
		return 1
	}
	f := 0.0
	for _, r := range e.ratios {
		f = max(f, r)
	}
	return min(max(f, 0.5), 4)
}

// Observe records a request's raw estimate and the prompt tokens its
// provider reported.
func (e *Estimator) Observe(raw, reported int) {
	if raw <= 0 || reported <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ratios = append(e.ratios, float64(reported)/float64(raw))
	if len(e.ratios) > calibrationWindow {
		e.ratios = e.ratios[len(e.ratios)-calibrationWindow:]
	}
}

// ContextState is a session's context accounting, for status and metrics.
type ContextState struct {
	Tokens      int     `json:"tokens"`      // the last request's estimate: prompt, reserve and margin
	Prompt      int     `json:"prompt"`      // of which the request itself
	Budget      int     `json:"budget"`      // agent.context_budget_tokens
	Threshold   int     `json:"threshold"`   // agent.compact_at of it
	Reserve     int     `json:"reserve"`     // agent.reserve_output_tokens
	Margin      int     `json:"margin"`      // the safety margin
	Factor      float64 `json:"calibration"` // the estimate's calibration against reported usage
	Compactions int64   `json:"compactions"` // committed by this run of klbr-core
	Degraded    int64   `json:"degraded"`    // of which degraded stubs
	LastError   string  `json:"last_problem,omitempty"`
}

// budget is the accounting of one request.
type budget struct {
	prompt, need, threshold, hard int
}

func (r *runner) budgetOf(bytes int) budget {
	b := r.l.live().Budgets
	prompt := r.l.est.Tokens(bytes)
	margin := b.ContextTokens / 50
	return budget{prompt: prompt, need: prompt + b.ReserveOutput + margin,
		threshold: int(float64(b.ContextTokens) * r.l.compactAt(r.session)), hard: b.ContextTokens}
}

// compactAt is the session's threshold fraction: agent.compact_at, or the
// lower one compaction.plan asked for.
func (l *Loop) compactAt(session string) float64 {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	if f, ok := l.earlier[session]; ok {
		return min(f, l.live().Budgets.CompactAt)
	}
	return l.live().Budgets.CompactAt
}

func (l *Loop) setCompactAt(session string, f float64) {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	l.earlier[session] = f
}

func (r *runner) publish(bg budget, problem string) {
	b := r.l.live().Budgets
	r.l.ctxMu.Lock()
	defer r.l.ctxMu.Unlock()
	st := r.l.ctxState[r.session]
	st.Tokens, st.Prompt, st.Budget, st.Threshold, st.Reserve, st.Margin, st.Factor =
		bg.need, bg.prompt, b.ContextTokens, bg.threshold, b.ReserveOutput, b.ContextTokens/50, r.l.est.Factor()
	if problem != "" {
		st.LastError = problem
	}
	r.l.ctxState[r.session] = st
}

func (l *Loop) counted(session string, kind string) {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	st := l.ctxState[session]
	st.Compactions++
	if kind == store.SummaryDegraded {
		st.Degraded++
	}
	l.ctxState[session] = st
}

// ContextState returns session's context accounting.
func (l *Loop) ContextState(session string) (ContextState, bool) {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	st, ok := l.ctxState[session]
	return st, ok
}

// Compact compacts session's context once, now, whatever its size (the
// operator's compact): the oldest eligible run, the fresh tail kept. It
// plans on a transcript of its own; the loop's notices the new version.
func (l *Loop) Compact(ctx context.Context, session string) (history.Result, error) {
	if l.compactor == nil {
		return history.Result{}, fmt.Errorf("%w: no summarizer", history.ErrUnavailable)
	}
	s, err := l.cfg.Store.Session(ctx, session)
	if err != nil {
		return history.Result{}, err
	}
	for range maxRounds {
		r := &runner{l: l, session: session, log: l.cfg.Log.With("session", session)}
		_, bytes, err := r.assemble(ctx, s, s.ContextEpoch)
		if err != nil {
			return history.Result{}, err
		}
		bg := r.budgetOf(bytes)
		bg.threshold = 0 // compact as much as one run allows
		plan, ok := r.planCompaction(s, bg, nil, "operator")
		if !ok {
			return history.Result{}, fmt.Errorf("%w: the active context has %d entries and no complete run of at least %d tokens outside the fresh tail", history.ErrNothingToCompact, len(r.transcript.entries), minRun)
		}
		cctx, span := compactSpan(tracing.WithTracer(ctx, l.cfg.Tracer), session, "operator")
		res, err := l.compactor.Compact(cctx, plan)
		endCompactSpan(span, res, err)
		if errors.Is(err, store.ErrStaleContext) {
			continue
		}
		if err == nil {
			l.counted(session, res.Kind)
		}
		return res, err
	}
	return history.Result{}, fmt.Errorf("compact: the context kept changing under %d attempts", maxRounds)
}

// ContextStates returns every session's context accounting.
func (l *Loop) ContextStates() map[string]ContextState {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	out := make(map[string]ContextState, len(l.ctxState))
	for k, v := range l.ctxState {
		out[k] = v
	}
	return out
}

// errBudget is a request that cannot be made to fit.
type errBudget struct{ msg string }

func (e *errBudget) Error() string { return e.msg }

// fit assembles the next request and compacts until it fits under the
// threshold, or until nothing more can be compacted and it fits the hard
// budget. A request that cannot fit returns an *errBudget naming the sizes.
func (r *runner) fit(ctx context.Context, a *attempt, s store.Session) ([]provider.Message, int, error) {
	for round := 0; ; round++ {
		msgs, bytes, err := r.assemble(ctx, s, s.ContextEpoch)
		if err != nil {
			return nil, 0, err
		}
		bg := r.budgetOf(bytes)
		r.publish(bg, "")
		if bg.need <= bg.threshold {
			return msgs, bytes, nil
		}
		protected, err := r.protected(ctx, a)
		if err != nil {
			return nil, 0, err
		}
		reason := "threshold"
		if bg.need > bg.hard {
			reason = "budget"
		}
		plan, ok := r.choose(ctx, s, bg, protected, reason)
		if !ok || round >= maxRounds || r.l.compactor == nil {
			if bg.need <= bg.hard {
				return msgs, bytes, nil // over the threshold, but nothing more to compact and it fits
			}
			return nil, 0, &errBudget{msg: fmt.Sprintf("context budget: the request needs about %d tokens (%d of prompt, %d reserved for output, %d margin) "+
				"and nothing more can be compacted (the system prompt, the tool schema and the current input remain); the budget is %d. "+
				"Raise agent.context_budget_tokens or reset the context (klbr-core reset)", bg.need, bg.prompt, r.l.live().Budgets.ReserveOutput,
				r.l.live().Budgets.ContextTokens/50, bg.hard)}
		}
		cctx, span := compactSpan(ctx, r.session, "threshold")
		res, err := r.l.compactor.Compact(cctx, plan)
		endCompactSpan(span, res, err)
		switch {
		case errors.Is(err, store.ErrStaleContext):
			continue // someone compacted meanwhile: plan against the current version
		case errors.Is(err, history.ErrNoReduction):
			if bg.need <= bg.hard {
				return msgs, bytes, nil
			}
			return nil, 0, &errBudget{msg: fmt.Sprintf("context budget: the request needs about %d tokens, the budget is %d, and compaction cannot reduce it further: %v",
				bg.need, bg.hard, err)}
		case err != nil:
			return nil, 0, fmt.Errorf("compact: %w", err)
		}
		r.l.counted(r.session, res.Kind)
		r.log.Info("compacted the context", "summary", res.Summary, "kind", res.Kind, "attempts", res.Attempts,
			"source_tokens", res.Source, "summary_tokens", res.Tokens)
	}
}

// protected lists the context items of the inputs this attempt was
// addressed with (operator input, DMs, mentions): they are never
// summarized away while it runs.
func (r *runner) protected(ctx context.Context, a *attempt) (map[int64]bool, error) {
	if a == nil || len(a.addressed) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(a.addressed))
	for i, in := range a.addressed {
		ids[i] = in.id
	}
	items, err := r.l.cfg.Store.InputItems(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := map[int64]bool{}
	for _, id := range items {
		out[id] = true
	}
	return out, nil
}

// units groups the transcript's entries into complete units: an assistant
// entry with all its calls' results (and whatever arrived between them) is
// one unit. The last unit may be incomplete (calls still open).
func (t *transcript) units(est func(int) int, protected map[int64]bool) (units []history.Unit, complete []bool) {
	open := map[string]bool{}
	var cur history.Unit
	curMsgs := [2]int{-1, -1}
	flush := func() {
		bytes := 0
		if curMsgs[0] >= 0 {
			for _, sz := range t.sizes[curMsgs[0]:curMsgs[1]] {
				bytes += sz + 1
			}
		}
		cur.Tokens = est(bytes)
		units = append(units, cur)
		complete = append(complete, len(open) == 0)
		cur, curMsgs = history.Unit{}, [2]int{-1, -1}
	}
	for _, e := range t.entries {
		cur.Refs = append(cur.Refs, e.ref)
		if e.input && protected[e.ref.Item] {
			cur.Protected = true
		}
		if e.n > 0 {
			if curMsgs[0] < 0 {
				curMsgs[0] = e.msg
			}
			curMsgs[1] = e.msg + e.n
		}
		for _, c := range e.opens {
			open[c] = true
		}
		if e.answers != "" {
			delete(open, e.answers)
		}
		if len(open) == 0 {
			flush()
		}
	}
	if len(cur.Refs) > 0 {
		flush()
	}
	return units, complete
}

// planCompaction picks the oldest eligible contiguous run of complete
// units: not protected, not in the fresh tail (the newest units, about a
// quarter of the budget, and always the last one), large enough that a
// summary shrinks it, and no larger than the summarizer can read. Under the
// hard budget's pressure, or when the operator asks, the fresh tail may be
// taken too, all but the last unit.
func (r *runner) planCompaction(s store.Session, bg budget, protected map[int64]bool, reason string) (history.Plan, bool) {
	c := r.candidates(s, bg, protected, reason, 1)
	if len(c) == 0 {
		return history.Plan{}, false
	}
	return c[0], true
}

// maxCandidates bounds the runs compaction.plan chooses among.
const maxCandidates = 8

// candidates lists up to n eligible runs, oldest first (see planCompaction).
func (r *runner) candidates(s store.Session, bg budget, protected map[int64]bool, reason string, n int) []history.Plan {
	t := r.transcript
	b := r.l.live().Budgets
	units, complete := t.units(r.l.est.Tokens, protected)
	if len(units) < 2 {
		return nil
	}
	tailEnd := len(units) - 1                       // units[tailEnd:] are kept
	if bg.need <= bg.hard && reason != "operator" { // the operator asked: only the last unit stays raw
		kept := units[len(units)-1].Tokens
		for tailEnd > 0 && kept+units[tailEnd-1].Tokens <= b.ContextTokens/4 {
			tailEnd--
			kept += units[tailEnd].Tokens
		}
	}
	eligible := func(i int) bool { return complete[i] && !units[i].Protected }
	summary := func(i int) bool { return len(units[i].Refs) == 1 && units[i].Refs[0].Summary != 0 }
	// Originals are summarized first; summaries are condensed into one of
	// a higher level only once together they hold an eighth of the budget
	// (so an early summary is not re-summarized at every compaction).
	sumTokens := 0
	for i := range tailEnd {
		if summary(i) {
			sumTokens += units[i].Tokens
		}
	}
	condense := sumTokens > b.ContextTokens/8 || reason == "operator"
	// Enough to get well under the threshold, within what one summarizer
	// request reads.
	want := max(bg.need-bg.threshold/2, minRun)
	maxSource := max(b.ContextTokens/2, minRun)
	var out []history.Plan
	for start := 0; start < tailEnd && len(out) < n; start++ {
		if !eligible(start) || (summary(start) && !condense) {
			continue
		}
		end, tokens := start, 0
		for end < tailEnd && eligible(end) && (summary(end) || !summary(start)) && (!summary(end) || condense) && tokens < want &&
			(tokens+units[end].Tokens <= maxSource || end == start) {
			tokens += units[end].Tokens
			end++
		}
		if tokens < minRun || (end-start == 1 && summary(start)) {
			continue // too small to shrink, or one summary alone
		}
		out = append(out, history.Plan{Session: r.session, Epoch: t.epoch, Version: t.version, Release: s.PolicyRevision,
			Units: units[start:end], Before: bg.need, Reason: reason})
		start = end - 1 // the next candidate starts after this one
	}
	return out
}

// choose asks compaction.plan which candidate to compact; without a policy,
// the oldest. ok is false when the policy declines (it may, under the hard
// budget only; the host checks).
func (r *runner) choose(ctx context.Context, s store.Session, bg budget, protected map[int64]bool, reason string) (history.Plan, bool) {
	policy := r.l.cfg.Compaction
	if policy == nil {
		return r.planCompaction(s, bg, protected, reason)
	}
	cands := r.candidates(s, bg, protected, reason, maxCandidates)
	if len(cands) == 0 {
		return history.Plan{}, false
	}
	in := hooks.CompactionInput{Reason: reason, Need: bg.need, Threshold: bg.threshold, Budget: bg.hard, CompactAt: r.l.live().Budgets.CompactAt}
	for i, c := range cands {
		cc := hooks.CompactionCandidate{Index: i, Units: len(c.Units), Tokens: c.Tokens(), Entries: len(c.Refs())}
		for _, ref := range c.Refs() {
			if ref.Summary != 0 {
				cc.Summaries++
			}
		}
		in.Candidates = append(in.Candidates, cc)
	}
	p := policy.PlanCompaction(ctx, r.session, in)
	if p.CompactAt > 0 {
		r.l.setCompactAt(r.session, p.CompactAt)
	}
	if p.Choose < 0 {
		return history.Plan{}, false
	}
	return cands[p.Choose], true
}

// minRun is the smallest run worth a summary: a degraded stub is about 150
// tokens, so anything this large strictly shrinks.
const minRun = 512
