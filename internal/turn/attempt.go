package turn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/outside"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// Why a phase (a model request or a cell) was cut off.
var (
	errPreempted = errors.New("operator input preempted the attempt")
	errStopped   = errors.New("the operator stopped the session")
)

// attempt is one run of model steps, under the behavior release that was
// active when it began (its prompt and attention policy): an activation
// during the attempt applies from the next one.
type attempt struct {
	id, frame     int64
	pin           store.Pin
	started       time.Time
	steps, tokens int
	empties       int
	// addressed holds the addressed inputs (operator input, DMs, mentions)
	// taken in by this attempt that no answer has answered yet.
	addressed []*addressedInput
	// taken are the inputs the attempt took in: their images are what it
	// is about (images.go).
	taken    map[int64]bool
	imagesBy time.Time // until when its requests wait for an image being fetched
	lastStep int64     // the id of the attempt's last recorded step
	lastText string    // the text of the last response without a tool call
	traceID  string    // the attempt's trace, "" when tracing is off
}

// wait is a terminal wait a cell asked for.
type wait struct {
	execution int64
	seconds   *float64
	reason    string
}

// attempt starts an attempt with inputs (possibly none) and runs it until it
// idles, waits, pauses, fails or is interrupted.
func (r *runner) attempt(ctx context.Context, inputs []store.PendingInput, wake string, fire bool) (err error) {
	st := r.l.cfg.Store
	a := &attempt{started: r.l.cfg.Clock()}
	ctx, span := r.attemptSpan(ctx)
	defer func() { endAttemptSpan(span, a, err) }()
	a.traceID = span.TraceID()
	traceID := a.traceID
	by := "input"
	if len(inputs) == 0 {
		by = "deadline"
	}
	// The closure may still run after Write returned on ctx's end (a
	// write whose caller gave up may commit): it reads nothing of r.
	guidance := r.guidance
	r.guidance = ""
	err = st.Write(ctx, func(tx *store.Tx) error {
		s, err := tx.Session(r.session)
		if err != nil {
			return err
		}
		if fire {
			if _, err := tx.FireWakeup(r.session, by); err != nil {
				return err
			}
		} else if err := tx.CancelWakeup(r.session); err != nil {
			return err
		}
		if len(inputs) == 0 && !fire {
			if _, err := tx.Notice(r.session, "turn.resumed", map[string]any{"reason": wake}, true); err != nil {
				return err
			}
		}
		a.frame = 0
		if len(inputs) > 0 {
			ids := make([]int64, len(inputs))
			for i, in := range inputs {
				ids[i] = in.ID
			}
			if err := tx.ClaimInputs(r.session, ids); err != nil {
				return err
			}
			if a.frame, err = tx.TakeFrame(frameOf(s, inputs), 0); err != nil {
				return err
			}
		}
		a.pin = store.Pin{Epoch: s.BehaviorEpoch, Release: s.PolicyRevision}
		a.id, _, err = tx.StartAttempt(store.NewAttempt{Session: r.session, Frame: a.frame, WakeReason: wake, TraceID: traceID})
		if err == nil && guidance != "" {
			// turn.prepare's guidance: the attempt's model sees it first.
			_, err = tx.Notice(r.session, "turn.guidance", map[string]any{"attempt": a.id, "guidance": guidance}, true)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("start attempt: %w", err)
	}
	attemptAttrs(span, a, wake)
	r.resume, r.retryAt = false, time.Time{}
	if len(inputs) > 0 {
		r.selfWakes = 0
	}
	a.address(inputs, r.l.cfg.Clock())
	err = r.steps(ctx, a)
	if err != nil {
		// A write the attempt's end needed failed (the operator moved the
		// session meanwhile, or the store failed): the attempt still ends,
		// and the next look at the session decides what follows.
		if ferr := r.finish(a, store.AttemptInterrupted, "ended by an error: "+err.Error()); ferr != nil && !errors.Is(ferr, store.ErrNoAttempt) {
			r.log.Error("could not end the attempt", "attempt", a.id, "error", ferr)
			r.unfinished, r.unfinishedWhy = a.id, err.Error()
		}
	}
	return err
}

// steps runs the model steps of an attempt.
func (r *runner) steps(ctx context.Context, a *attempt) error {
	cfg := &r.l.cfg
	b := r.l.live().Budgets
	pre := newPreemption(r)
	defer pre.stop()
	for step := 0; ; step++ {
		if ctx.Err() != nil || cfg.Sessions.Draining(r.session) {
			return r.finish(a, store.AttemptInterrupted, "klbr-core is stopping; the attempt resumes after a restart")
		}
		g, err := cfg.Store.Glance(ctx, r.session)
		if err != nil {
			return err
		}
		if step > 0 && g.PendingOperator+g.PendingOther > 0 {
			if err := r.takeIn(ctx, a); err != nil {
				return err
			}
		}
		switch {
		case a.steps >= b.MaxSteps:
			return r.guard(ctx, a, fmt.Sprintf("step budget: %d model requests in this attempt (agent.max_steps)", a.steps))
		case a.tokens >= b.MaxTokens:
			return r.guard(ctx, a, fmt.Sprintf("token budget: %d tokens in this attempt (agent.max_tokens)", a.tokens))
		case cfg.Clock().Sub(a.started) >= b.MaxTurn:
			return r.guard(ctx, a, fmt.Sprintf("time budget: the attempt ran %s (agent.max_turn_seconds)", b.MaxTurn))
		}
		s := g.Session
		if s.State != store.StateRunning {
			return r.finish(a, store.AttemptInterrupted, "the session left running: "+string(s.State))
		}
		s.PolicyRevision = a.pin.Release     // the attempt's prompt, whatever was activated since
		msgs, bytes, err := r.fit(ctx, a, s) // a reset mid-attempt applies from the next request
		var over *errBudget
		switch {
		case errors.As(err, &over):
			if err := cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
				_, err := tx.Notice(r.session, "context.budget", map[string]any{"budget": b.ContextTokens, "message": over.msg}, false)
				return err
			}); err != nil {
				return err
			}
			return r.pause(a, over.msg)
		case err != nil && ctx.Err() != nil:
			return r.finish(a, store.AttemptInterrupted, interruption(err, ctx))
		case err != nil:
			return r.pause(a, "context assembly failed: "+err.Error())
		}
		if adds := r.additions(ctx, a); len(adds) > 0 {
			// context.prepare's additions ride on this request only, after
			// the history, labeled as the policy's: nothing is removed.
			msgs = append(msgs, provider.Message{Role: "user", Content: "[klbr context.prepare]\n" + strings.Join(adds, "\n\n")})
		}
		msgs = r.withImages(ctx, a, msgs)
		child := s.ParentID != ""
		if child && cfg.Check != nil {
			if err := cfg.Check(context.WithoutCancel(ctx), r.session); err != nil {
				return r.finish(a, store.AttemptInterrupted, "no model request: "+err.Error())
			}
		}
		reserved := func() {}
		if child && cfg.Reserve != nil {
			rel, err := cfg.Reserve(ctx, r.session, provider.Request{Messages: msgs, Tools: []provider.Tool{provider.PythonTool(toolDescription)}})
			if err != nil {
				if ctx.Err() != nil {
					return r.finish(a, store.AttemptInterrupted, interruption(err, ctx))
				}
				return r.finish(a, store.AttemptInterrupted, "no model request: "+err.Error())
			}
			reserved = rel
		}
		phase, end := pre.phase(ctx)
		release, err := r.slot(phase, child)
		if err != nil {
			reserved()
			cause := context.Cause(phase)
			end()
			return r.finish(a, store.AttemptInterrupted, interruption(cause, ctx))
		}
		a.steps++
		started := cfg.Clock()
		resp, reqErr := r.request(phase, a, msgs)
		release()
		raw := Raw(bytes)
		cause := context.Cause(phase)
		end()
		if reqErr == nil {
			if err := checkCallIDs(resp.ToolCalls); err != nil {
				reqErr = fmt.Errorf("%w: %v", errBadCalls, err)
			}
		}
		stepID, err := r.recordStep(ctx, a, started, resp, reqErr, cause, raw)
		reserved() // the step, and its ledger row, is committed
		if err != nil {
			return err
		}
		a.lastStep = stepID
		if reqErr != nil {
			if cause != nil {
				return r.finish(a, store.AttemptInterrupted, interruption(cause, ctx))
			}
			return r.modelFailed(ctx, a, stepID, reqErr)
		}
		if r.failures > 0 {
			r.failures = 0
			r.setStatus(nil)
		}
		if len(resp.ToolCalls) == 0 {
			if strings.TrimSpace(resp.Content) == "" {
				a.empties++
				if a.empties >= b.MaxEmpty {
					return r.guard(ctx, a, fmt.Sprintf("%d empty completions in a row (agent.max_empty_completions)", a.empties))
				}
				continue
			}
			a.empties = 0
			a.lastText = resp.Content
			done, err := r.endOfTurn(ctx, a)
			if done || err != nil {
				return err
			}
			continue
		}
		a.empties = 0
		w, interrupted, err := r.runCalls(ctx, pre, a, stepID, resp.ToolCalls)
		if err != nil {
			return err
		}
		if interrupted != nil {
			if errors.Is(interrupted, errCellFailed) && ctx.Err() == nil {
				// The workbench cannot run cells: retried after a backoff
				// like a failed request; after as many in a row the attempt
				// ends, and the next input starts a new one.
				r.cellErrors++
				if r.cellErrors >= b.MaxErrors {
					return r.guard(ctx, a, fmt.Sprintf("%d cells in a row could not run (agent.max_consecutive_errors); last: %v", r.cellErrors, interrupted))
				}
				r.retryAt = cfg.Clock().Add(b.backoff(r.cellErrors))
			}
			return r.finish(a, store.AttemptInterrupted, interruption(interrupted, ctx))
		}
		if w == nil {
			switch n := r.next(ctx, a, len(resp.ToolCalls)); n.Decision {
			case "end":
				return r.endByPolicy(ctx, a, n.Reason)
			case "wait":
				w = &wait{seconds: n.Seconds, reason: "turn.next: " + clip(n.Reason, 200)}
			}
		}
		if w != nil {
			waited, err := r.commitWait(ctx, a, w)
			if waited && err == nil {
				r.clearBackoff()
			}
			if waited || err != nil {
				return err
			}
		}
	}
}

func interruption(cause error, ctx context.Context) string {
	if ctx.Err() != nil {
		return errStopping.Error()
	}
	return cause.Error()
}

// takeIn takes the ready pending inputs into the running attempt at a step
// boundary, as a new frame.
func (r *runner) takeIn(ctx context.Context, a *attempt) error {
	st := r.l.cfg.Store
	pending, err := st.PendingInputs(ctx, r.session)
	if err != nil || len(pending) == 0 {
		return err
	}
	ready, _ := r.plan(ctx, &a.pin, pending, r.l.cfg.Clock())
	if len(ready) == 0 {
		return nil
	}
	var frame int64
	err = st.Write(ctx, func(tx *store.Tx) error {
		s, err := tx.Session(r.session)
		if err != nil {
			return err
		}
		ids := make([]int64, len(ready))
		for i, in := range ready {
			ids[i] = in.ID
		}
		if err := tx.ClaimInputs(r.session, ids); err != nil {
			return err
		}
		s.PolicyRevision = a.pin.Release // the frame is taken under the attempt's policy
		frame, err = tx.TakeFrame(frameOf(s, ready), a.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("take in input: %w", err)
	}
	a.frame = frame
	a.address(ready, r.l.cfg.Clock())
	return nil
}

// addressedInput is an addressed input an attempt took in, until answered.
type addressedInput struct {
	id           int64
	operator     bool
	conversation string
	afterStep    int64     // answers by cells of later steps count
	takenAt      time.Time // decisions from then on count
	reminded     bool
}

// address notes the addressed inputs of a frame the attempt took in.
func (a *attempt) address(inputs []store.PendingInput, now time.Time) {
	for _, in := range inputs {
		if a.taken == nil {
			a.taken = map[int64]bool{}
		}
		a.taken[in.ID] = true
		if in.Conversation == store.ChildTaskConversation {
			continue // a child answers its task with agents.finish, not a send
		}
		if in.Directed || in.SourceKind == "operator" {
			a.addressed = append(a.addressed, &addressedInput{id: in.ID, operator: in.SourceKind == "operator",
				conversation: in.Conversation, afterStep: a.lastStep, takenAt: now})
		}
	}
}

// answers reports whether a answers in: a send to its conversation by a
// cell that ran after it was taken in, or a decision on its item. A send
// to another conversation does not answer it.
func (in *addressedInput) answeredBy(a store.Answer) bool {
	if a.Input != 0 {
		return a.Input == in.id && !a.At.Before(in.takenAt.Truncate(time.Millisecond))
	}
	if a.Step <= in.afterStep {
		return false
	}
	return a.Conversation == in.conversation || in.operator && a.Conversation == "operator"
}

// endOfTurn handles a response with text and no tool call: the model ended
// its turn without waiting. Each addressed input no answer answered gets
// one reminder that names it; after that, or when everything addressed was
// answered, the session idles.
func (r *runner) endOfTurn(ctx context.Context, a *attempt) (done bool, err error) {
	st := r.l.cfg.Store
	if len(a.addressed) > 0 {
		answers, err := st.AttemptAnswerList(ctx, a.id)
		if err != nil {
			return true, err
		}
		open := a.addressed[:0]
		for _, in := range a.addressed {
			if !slices.ContainsFunc(answers, in.answeredBy) {
				open = append(open, in)
			}
		}
		a.addressed = open
	}
	var remind []int64
	for _, in := range a.addressed {
		if !in.reminded {
			in.reminded = true
			remind = append(remind, in.id)
		}
	}
	if len(remind) > 0 {
		handles, err := st.InputHandles(ctx, remind)
		if err != nil {
			return true, err
		}
		return false, st.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
			_, err := tx.Notice(r.session, "delivery.reminder", map[string]any{"attempt": a.id, "frame": a.frame,
				"inputs": remind, "text": reminderText(handles)}, true)
			return err
		})
	}
	r.clearBackoff()
	reason := "idle: the model ended its turn without waiting"
	if n := len(a.addressed); n > 0 {
		reason = fmt.Sprintf("idle: the model ended its turn after a reminder, with %d addressed input(s) unanswered", n)
	}
	err = st.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		if err := tx.FinishAttempt(a.id, store.AttemptIdle, reason); err != nil {
			return err
		}
		return tx.TransitionSession(r.session, store.StateRunning, store.StateReady, reason)
	})
	if err == nil && r.l.cfg.Idle != nil {
		r.l.cfg.Idle(context.WithoutCancel(ctx), r.session, a.lastText)
	}
	return true, err
}

// reminderText names each unanswered input and how to answer it.
func reminderText(hs []store.InputHandle) string {
	var b strings.Builder
	b.WriteString("Reminder: nothing has been delivered for ")
	if len(hs) == 1 {
		b.WriteString("this input yet:")
	} else {
		fmt.Fprintf(&b, "these %d inputs yet:", len(hs))
	}
	for _, h := range hs {
		switch {
		case h.SourceKind == "operator":
			fmt.Fprintf(&b, "\n- the operator's input %d: answer with `await local.send(...)`", h.ID)
		case h.Alias != "":
			where := h.Alias
			if h.Kind == "dm" {
				where += " (DM)"
			}
			fmt.Fprintf(&b, "\n- the Discord message %s from %s in %s: answer with a send to %s", h.MessageID, outside.Name(h.Author), where, h.Alias)
		default:
			fmt.Fprintf(&b, "\n- input %d from %s in %s", h.ID, outside.Name(h.Author), outside.Name(h.Conversation))
		}
	}
	b.WriteString("\n" + reminderTail)
	return b.String()
}

// slot takes a model-request slot (none: Config.Slots unset); while a child
// waits for one, its status says so.
func (r *runner) slot(ctx context.Context, child bool) (release func(), err error) {
	slots := r.l.cfg.Slots
	if slots == nil {
		return func() {}, nil
	}
	if st := slots.Stats(); !child || st.Roots+st.Children < st.Size-1 && st.WaitingChildren == 0 {
		return slots.Acquire(ctx, child) // a root's, or one free at once: no status to show
	}
	r.statusMu.Lock()
	before := r.status
	r.status = &Retry{State: RetryWaitingSlot, NextAt: r.l.cfg.Clock(), LastError: fmt.Sprintf(
		"waiting for a model request slot: children hold at most %d of the %d ([agents] model_slots)", slots.Stats().Size-1, slots.Stats().Size)}
	r.statusMu.Unlock()
	defer func() {
		r.statusMu.Lock()
		if r.status != nil && r.status.State == RetryWaitingSlot {
			r.status = before
		}
		r.statusMu.Unlock()
	}()
	return slots.Acquire(ctx, child)
}

// request sends one model request; deltas go to the live hub.
func (r *runner) request(ctx context.Context, a *attempt, msgs []provider.Message) (*provider.Response, error) {
	step := int64(a.steps)
	cfg := &r.l.cfg
	hub := cfg.Deltas
	req := provider.Request{Messages: msgs, Tools: []provider.Tool{provider.PythonTool(toolDescription)}, Stream: true,
		Meta: provider.RequestMeta{Session: r.session, Purpose: "turn", Directed: len(a.addressed) > 0}}
	if hub != nil {
		var index int64
		req.OnDelta = func(d provider.Delta) {
			base := live.Delta{Session: r.session, Attempt: a.id, Step: step, Index: index}
			switch {
			case d.Content != "":
				base.Kind, base.Text = "content", d.Content
			case d.Reasoning != "":
				base.Kind, base.Text = "reasoning", d.Reasoning
			case d.ToolCall != nil:
				base.Kind, base.Text, base.Call = "tool", d.ToolCall.Arguments, d.ToolCall.ID
			default:
				return
			}
			index++
			hub.Publish(base)
		}
		defer func() {
			hub.Publish(live.Delta{Session: r.session, Attempt: a.id, Step: step, Kind: "end", Index: index})
		}()
	}
	ctx, span := r.modelSpan(ctx, msgs)
	resp, err := cfg.Model.Complete(ctx, req)
	r.endModelSpan(ctx, span, resp, err)
	outcome := "ok"
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = "cancelled"
	case err != nil:
		outcome = "error"
		var pe *provider.Error
		if errors.As(err, &pe) {
			outcome = "error_" + strings.ReplaceAll(pe.Kind.String(), " ", "_")
		}
	}
	var usage provider.Usage
	if resp != nil {
		usage = resp.Usage
	}
	cfg.Observe(answeredBy(r.l.live().Route, resp, err), outcome, usage)
	return resp, err
}

// answeredBy names the route that answered or failed last: the one a Router
// recorded, else the configured one.
func answeredBy(route string, resp *provider.Response, err error) string {
	var pe *provider.Error
	switch {
	case resp != nil && resp.Route != "":
		return resp.Route
	case errors.As(err, &pe) && pe.Route != "":
		return pe.Route
	}
	return route
}

// recordStep records a step's response, complete or partial, before
// anything in it runs.
func (r *runner) recordStep(ctx context.Context, a *attempt, started time.Time, resp *provider.Response, reqErr, cause error, raw int) (int64, error) {
	res := store.StepResult{Session: r.session, Attempt: a.id, TraceID: a.traceID, Ordinal: a.steps, Started: started,
		Route: answeredBy(r.l.live().Route, resp, reqErr), State: "completed", Estimated: raw, NotSent: errors.Is(reqErr, provider.ErrNotSent)}
	if resp != nil && resp.Usage.PromptTokens != nil && reqErr == nil && res.Route == r.l.live().Route {
		// The estimate is calibrated against the agent's own route; a
		// fallback's counts would skew it.
		r.l.est.Observe(raw, *resp.Usage.PromptTokens)
	}
	switch {
	case reqErr != nil && cause != nil:
		res.State, res.Error = "interrupted", interruption(cause, ctx)
	case reqErr != nil:
		res.State, res.Error = "failed", reqErr.Error()
	}
	if resp != nil {
		res.Text, res.Reasoning, res.ReasoningField, res.FinishReason = resp.Content, resp.Reasoning, resp.ReasoningField, resp.FinishReason
		res.ReasoningDetails = resp.ReasoningDetails
		res.CostUSD, res.CostSource = resp.CostUSD, resp.CostSource
		res.Usage = store.StepUsage{Prompt: resp.Usage.PromptTokens, Completion: resp.Usage.CompletionTokens,
			CacheRead: resp.Usage.CacheReadTokens, CacheWrite: resp.Usage.CacheWriteTokens, CacheMiss: resp.Usage.CacheMissTokens}
		if reqErr == nil {
			for _, c := range resp.ToolCalls {
				sent, madeUp := resp.MadeUpIDs[c.ID]
				res.Calls = append(res.Calls, store.StepCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments, IDMadeUp: madeUp, SentID: sent})
			}
		}
		for _, n := range []*int{resp.Usage.PromptTokens, resp.Usage.CompletionTokens} {
			if n != nil {
				a.tokens += *n
			}
		}
	}
	var id int64
	err := r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		id, err = tx.RecordStep(res)
		return err
	})
	return id, err
}

// checkCallIDs refuses a response whose tool calls cannot be answered
// under their ids: an id missing, too long, or used twice.
func checkCallIDs(calls []provider.ToolCall) error {
	seen := map[string]bool{}
	for _, c := range calls {
		if c.ID == "" || len(c.ID) > 256 || seen[c.ID] {
			return fmt.Errorf("the model's tool calls cannot be answered: call id %q is empty, too long or repeated", c.ID)
		}
		seen[c.ID] = true
	}
	return nil
}

var (
	errBadCalls   = errors.New("invalid tool calls")
	errCellFailed = errors.New("the cell could not run")
)

// runCalls answers a step's tool calls in order: each valid python call
// runs as a cell, journaled under its call id. After a wait, the rest are
// skipped; after an interruption, they are closed as interrupted.
func (r *runner) runCalls(ctx context.Context, pre *preemption, a *attempt, step int64, calls []provider.ToolCall) (*wait, error, error) {
	cfg := &r.l.cfg
	var w *wait
	var interrupted error
	for _, c := range calls {
		state, msg := store.ToolState(""), ""
		code, problem := parseCall(c)
		switch {
		case interrupted != nil:
			state, msg = store.ToolInterrupted, "not run: "+interruption(interrupted, ctx)
		case w != nil:
			state, msg = store.ToolSkipped, "not run: an earlier call of this group waited (runtime.wait is a terminal yield)"
		case problem != "":
			state, msg = store.ToolInvalid, problem
		}
		if state != "" {
			if err := r.closeCall(ctx, step, c.ID, state, msg); err != nil {
				return nil, nil, err
			}
			continue
		}
		if held := r.reviewCell(ctx, a, step, c.ID, code); held != "" {
			if err := r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
				return tx.HoldToolCall(r.session, step, c.ID, held)
			}); err != nil {
				return nil, nil, err
			}
			continue
		}
		phase, end := pre.phase(ctx)
		cellCtx, span := cellSpan(phase, step, c.ID, code)
		res, err := cfg.Bench.Execute(workbench.WithCall(cellCtx, workbench.Call{Step: step, ID: c.ID, Frame: a.frame}), r.session, code, nil)
		endCellSpan(span, res, err)
		cause := context.Cause(phase)
		end()
		if cause != nil {
			interrupted = cause
		}
		if err != nil {
			// The cell did not run, or its outcome could not be recorded:
			// answer the call (if it is still open) rather than leave it.
			if cerr := r.closeCall(ctx, step, c.ID, store.ToolInterrupted, "not run: "+err.Error()); cerr != nil {
				r.log.Debug("tool call already answered", "call", c.ID, "error", cerr)
			}
			if interrupted == nil {
				interrupted = fmt.Errorf("%w: %w", errCellFailed, err)
			}
			continue
		}
		r.cellErrors = 0
		if o := res.Outcome; o != nil && o.Status == "yielded" {
			w = parseYield(res.Execution, o.Yield)
		}
	}
	return w, interrupted, nil
}

func (r *runner) closeCall(ctx context.Context, step int64, id string, state store.ToolState, msg string) error {
	return r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		return tx.CloseToolCall(r.session, step, id, state, msg)
	})
}

// parseCall returns the code of a python call, or why it cannot run.
func parseCall(c provider.ToolCall) (code, problem string) {
	if c.Function.Name != "python" {
		return "", fmt.Sprintf("not run: there is no tool %q; the one tool is python(code)", c.Function.Name)
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
		// The route is sent {} in their place (provider.replay); this
		// result is how the model learns what it wrote.
		return "", fmt.Sprintf("not run: the arguments are not a JSON object (%v); you wrote: %s", err, quoteArgs(c.Function.Arguments))
	}
	raw, ok := args["code"]
	if !ok || len(args) != 1 {
		return "", `not run: python takes exactly one argument, {"code": "..."}`
	}
	if err := json.Unmarshal(raw, &code); err != nil {
		return "", "not run: code must be a string"
	}
	if strings.TrimSpace(code) == "" {
		return "", "not run: code is empty"
	}
	return code, ""
}

// addProviderDetail adds what a provider error says to a model.error
// notice: the route, the request URL (never a key), the HTTP status and the
// provider's own message and code, each when known.
func addProviderDetail(notice map[string]any, err error) {
	var pe *provider.Error
	if !errors.As(err, &pe) {
		return
	}
	for k, v := range map[string]string{"route": pe.Route, "request_url": pe.URL, "provider_message": pe.Message, "provider_code": pe.Code} {
		if v != "" {
			notice[k] = v
		}
	}
	if pe.Kind == provider.KindHTTP {
		notice["status"] = pe.Status
	}
}

// quoteArgs quotes invalid arguments for their error result, bounded.
func quoteArgs(s string) string {
	const max = 2000
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + fmt.Sprintf(" … (%d bytes in all)", len(s))
	}
	return strconv.Quote(s)
}

// parseYield reads a yielded outcome's runtime.wait payload.
func parseYield(execution int64, payload json.RawMessage) *wait {
	var y struct {
		Op      string   `json:"op"`
		Seconds *float64 `json:"seconds"`
		Reason  string   `json:"reason"`
	}
	if err := json.Unmarshal(payload, &y); err != nil || y.Op != "runtime.wait" {
		return &wait{execution: execution, reason: "the cell yielded"}
	}
	return &wait{execution: execution, seconds: y.Seconds, reason: y.Reason}
}

// commitWait commits a wait, unless input is ready: then the attempt goes on
// and its next boundary takes the input in.
func (r *runner) commitWait(ctx context.Context, a *attempt, w *wait) (waited bool, err error) {
	now := r.l.cfg.Clock()
	// Plan what is pending now, so that input the plan defers (ambient
	// chatter in its batch) does not cancel the wait.
	pending, err := r.l.cfg.Store.PendingInputs(ctx, r.session)
	if err != nil {
		return false, err
	}
	r.plan(ctx, &a.pin, pending, now)
	var deadline *time.Time
	if w.seconds != nil {
		d := now.Add(time.Duration(*w.seconds * float64(time.Second)))
		deadline = &d
	}
	reason := w.reason
	if reason == "" {
		reason = "waiting"
	}
	var woken bool
	err = r.l.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		woken, err = tx.CommitWait(store.Wait{Session: r.session, Attempt: a.id, Execution: w.execution,
			Deadline: deadline, Seconds: w.seconds, Reason: reason, Ready: r.readyNow(now)})
		if err == nil && woken {
			_, err = tx.Notice(r.session, "wait.woken", map[string]any{"by": "input", "reason": reason, "waited_ms": 0,
				"message": "the wait did not start: input was already pending"}, true)
		}
		return err
	})
	return !woken, err
}

// finish ends the attempt without moving the session (it is interrupted:
// the operator or the daemon moved it, or the next tick resumes it).
func (r *runner) finish(a *attempt, state, outcome string) error {
	return r.l.cfg.Store.Write(context.Background(), func(tx *store.Tx) error {
		return tx.FinishAttempt(a.id, state, outcome)
	})
}

// pause ends the attempt paused and pauses the session with the reason,
// which its notice shows. The inputs stay recorded; `klbr-core start`
// resumes the session.
func (r *runner) pause(a *attempt, reason string) error {
	return r.l.cfg.Store.Write(context.Background(), func(tx *store.Tx) error {
		if err := tx.FinishAttempt(a.id, store.AttemptPaused, reason); err != nil {
			return err
		}
		s, err := tx.Session(r.session)
		if err != nil || s.State != store.StateRunning {
			return err
		}
		return tx.TransitionSession(r.session, store.StateRunning, store.StatePaused, reason)
	})
}

// preemption watches the session while an attempt runs and cuts off the
// current phase (a model request or a cell) when operator input is pending
// or the operator stopped or paused the session.
type preemption struct {
	r      *runner
	mu     sync.Mutex
	cancel context.CancelCauseFunc // the current phase's, nil between phases
	seen   int64                   // the store's ControlGen at the last look (-1: never looked)
	done   chan struct{}
	wake   <-chan struct{}
	unwat  func()
}

func newPreemption(r *runner) *preemption {
	p := &preemption{r: r, done: make(chan struct{}), seen: -1}
	p.wake, p.unwat = r.l.cfg.Store.Watch(r.session)
	go func() {
		for {
			select {
			case <-p.done:
				return
			case <-p.wake:
				p.check()
			}
		}
	}()
	return p
}

func (p *preemption) stop() { close(p.done); p.unwat() }

// phase starts a phase under ctx; end it with the returned func.
func (p *preemption) phase(ctx context.Context) (context.Context, func()) {
	pctx, cancel := context.WithCancelCause(ctx)
	p.mu.Lock()
	p.cancel = cancel
	p.mu.Unlock()
	p.check() // input that arrived just before the phase began
	return pctx, func() {
		p.mu.Lock()
		p.cancel = nil
		p.mu.Unlock()
		cancel(nil)
	}
}

func (p *preemption) check() {
	st := p.r.l.cfg.Store
	gen := st.ControlGen(p.r.session)
	p.mu.Lock()
	cancel := p.cancel
	if cancel == nil || gen == p.seen {
		// Between phases, or nothing was admitted and no state moved since
		// the last look found nothing to do.
		p.mu.Unlock()
		return
	}
	p.seen = gen
	p.mu.Unlock()
	g, err := st.Glance(context.Background(), p.r.session)
	switch {
	case err != nil:
		p.mu.Lock()
		p.seen = -1 // look again at the next wake
		p.mu.Unlock()
	case g.State == store.StateStopped || g.State == store.StatePaused:
		cancel(fmt.Errorf("%w (%s)", errStopped, g.State))
	case g.PendingOperator > 0:
		cancel(errPreempted)
	}
}
