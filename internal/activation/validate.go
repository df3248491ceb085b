package activation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// The host's validation of a candidate release. It ships with klbr-core:
// the suite is klbr_runtime.validate (in the runtime, not in the release)
// and the fixtures and the replay are here, so a candidate cannot edit what
// judges it. Its own tests still run; their outcome is recorded, not obeyed.

// Bounds of validation.
const (
	SuiteTimeout     = time.Minute
	maxSuiteOutput   = 256 << 10
	maxSuiteChecks   = 4096
	maxSuiteSlots    = 256
	maxCheckDetail   = 2000
	DefaultReplayN   = 100
	replayDeadline   = 2 * time.Second
	maxChangesListed = 50
)

// Check is one finding of the host suite or of a slot's fixtures.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Change is a recorded decision the candidate would make differently.
type Change struct {
	Invocation int64           `json:"invocation"`
	Slot       string          `json:"slot"`
	At         time.Time       `json:"at"`
	Release    string          `json:"release"` // the release that decided it
	Before     json.RawMessage `json:"before"`
	After      json.RawMessage `json:"after,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// Replay is the replay of recorded invocations against a candidate.
type Replay struct {
	PerSlot  int            `json:"per_slot"` // N: the newest N invocations of each slot
	Replayed map[string]int `json:"replayed"` // by slot
	Changed  map[string]int `json:"changed"`  // by slot
	Changes  []Change       `json:"changes"`  // the first maxChangesListed
	TookMS   float64        `json:"took_ms"`
}

// OwnTests is the outcome of the candidate's own tests/: recorded, never
// what decides.
type OwnTests struct {
	Present  bool   `json:"present"`
	Passed   bool   `json:"passed"`
	ExitCode int    `json:"exit_code"`
	Tail     string `json:"tail,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Report is a release's validation report, stored with it.
type Report struct {
	Release     string       `json:"release"`
	OK          bool         `json:"ok"`
	Refused     string       `json:"refused,omitempty"` // why, when not OK
	At          time.Time    `json:"at"`
	TookMS      float64      `json:"took_ms"`
	Suite       []Check      `json:"suite"`       // klbr_runtime.validate: imports, effects at import, SLOTS, SKILL.md
	Attempts    []string     `json:"attempts"`    // effects attempted during import (refused)
	Slots       []Check      `json:"slots"`       // each bound slot's answer to its fixture
	Replay      Replay       `json:"replay"`      // recorded invocations, replayed
	OwnTests    OwnTests     `json:"own_tests"`   // the candidate's tests/: not authoritative
	Environment *Fingerprint `json:"environment"` // interpreter, runtime and dependencies
}

// slotFixture is a slot's fixture input and whether every release must bind it.
type slotFixture struct {
	required bool
	input    any
	// shape, if set, checks the answer instead of hooks.CheckResult (whose
	// rules depend on the live configuration, which a fixture does not have).
	shape func(json.RawMessage) error
}

// modelPlanShape is model.plan's answer shape: {routes: [str, ...], reason: str};
// whether the routes are configured is the live host's business.
func modelPlanShape(out json.RawMessage) error {
	var p struct {
		Routes []string `json:"routes"`
		Reason *string  `json:"reason"`
	}
	if err := json.Unmarshal(out, &p); err != nil || p.Routes == nil || p.Reason == nil {
		return fmt.Errorf("answered %s, not {routes: [str], reason: str}", cut(string(out), 200))
	}
	return nil
}

// check checks a slot's answer to its fixture.
func (f slotFixture) check(slot string, out json.RawMessage) error {
	if f.shape != nil {
		return f.shape(out)
	}
	return hooks.CheckResult(slot, f.input, out)
}

// slotFixtures are the fixtures of every slot the host calls. A bound slot
// that has none is reported (the host never calls it), not refused.
var slotFixtures = map[string]slotFixture{
	hooks.SlotReview: {required: true, input: hooks.ReviewInput{Channel: "local", Text: "candidate check", Session: "check"}},
	hooks.SlotPlan:   {required: true, input: hooks.PlanInput{Items: []hooks.PlanItem{{ID: 1, SourceKind: "operator", Conversation: "operator", ReceivedAt: 1}}, Now: 2}},
	hooks.SlotModelPlan: {input: provider.PlanInput{RequestMeta: provider.RequestMeta{Session: "check", Purpose: "turn"},
		Routes: []provider.RouteInfo{{Name: "main", Model: "m"}}, Default: []string{"main"}}, shape: modelPlanShape},
	hooks.SlotCompactionPlan: {input: hooks.CompactionInput{Reason: "threshold", Need: 100, Threshold: 80, Budget: 120, CompactAt: 0.8,
		Candidates: []hooks.CompactionCandidate{{Index: 0, Entries: 4, Units: 2, Tokens: 60, FirstAt: 1, LastAt: 2}}}},
	hooks.SlotSummaryPrepare: {input: hooks.PrepareInput{Prompt: "Summarize the run.", SourceBytes: 1000, Entries: 4, Depth: 1}},
	hooks.SlotJobPlan:        {input: jobs.PlanInput{Kind: "command", Spec: json.RawMessage(`{"argv":["true"]}`), Recovery: "manual"}},
}

// The slots of the hooks registry (hooks.Slots) that the table above does
// not name get the registry's example input, checked as hooks.test checks an
// answer: a slot added to the host is validated and replayed without an
// entry here. Observers are not called with a fixture (they act on real
// events); hooks.CheckCandidate looks them up.
func init() {
	for _, sl := range hooks.Slots() {
		if _, ok := slotFixtures[sl.Name]; ok || sl.Fixture == nil || sl.Kind == hooks.KindObserver {
			continue
		}
		name, in := sl.Name, sl.Fixture
		raw, err := json.Marshal(in)
		if err != nil {
			panic(fmt.Sprintf("hooks registry: %s's example input: %v", name, err))
		}
		slotFixtures[name] = slotFixture{input: in, shape: func(out json.RawMessage) error { return hooks.Validate(name, raw, out) }}
	}
}

// ReplayN is how many recorded invocations of each slot an activation
// replays against a candidate.
var ReplayN = DefaultReplayN

// Validate runs the host's validation of release for session and returns
// its report and, when it passed, the candidate's hook worker ready to serve.
func (s *Service) Validate(ctx context.Context, session, release string) (Report, *worker.Worker, error) {
	start := time.Now()
	rep := Report{Release: release, At: start, Suite: []Check{}, Slots: []Check{}, Attempts: []string{},
		Replay: Replay{PerSlot: ReplayN, Replayed: map[string]int{}, Changed: map[string]int{}, Changes: []Change{}}}
	refuse := func(format string, a ...any) (Report, *worker.Worker, error) {
		rep.OK, rep.Refused = false, fmt.Sprintf(format, a...)
		rep.TookMS = ms(time.Since(start))
		return rep, nil, fmt.Errorf("%w: %s", ErrCandidate, rep.Refused)
	}
	fp, err := s.fingerprint(release)
	if err != nil {
		return refuse("its environment: %v", err)
	}
	rep.Environment = &fp
	// A release's own dependencies are staged first, into an environment of
	// its own; the suite imports its modules with it.
	if fp.Site, err = s.stageEnv(ctx, release); err != nil {
		return refuse("its environment: %v", err)
	}
	// The three processes are independent: the candidate's own tests, the
	// host suite and the candidate's hook worker start side by side.
	var wg sync.WaitGroup
	var suite suiteReport
	var suiteErr, startErr error
	var w *worker.Worker
	wg.Add(3)
	go func() { defer wg.Done(); rep.OwnTests = s.runTests(ctx, session, release) }()
	go func() { defer wg.Done(); suite, suiteErr = s.runSuite(ctx, session, release, fp.Site) }()
	go func() { defer wg.Done(); w, startErr = s.hooks.StartWorker(ctx, session, release) }()
	wg.Wait()
	ok := false
	defer func() {
		if !ok && w != nil {
			w.Kill()
		}
	}()
	if suiteErr != nil {
		return refuse("%v", suiteErr)
	}
	rep.Suite, rep.Attempts = suite.Checks, suite.Attempts
	for _, c := range suite.Checks {
		if !c.OK {
			return refuse("host suite: %s: %s", c.Name, c.Detail)
		}
	}
	bound := map[string]bool{}
	for _, slot := range suite.Slots {
		bound[slot] = true
	}
	var missing []string
	for slot, f := range slotFixtures {
		if f.required && !bound[slot] {
			missing = append(missing, slot)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return refuse("klbr_hooks.SLOTS does not bind the required slots %s", strings.Join(missing, ", "))
	}

	if startErr != nil {
		return refuse("its hook worker did not start: %v", startErr)
	}
	for _, slot := range suite.Slots {
		f, known := slotFixtures[slot]
		if !known {
			rep.Slots = append(rep.Slots, Check{Name: slot, OK: true, Detail: "bound, but this klbr-core never calls it: no fixture"})
			continue
		}
		b, _ := json.Marshal(f.input)
		cctx, cancel := context.WithTimeout(ctx, replayDeadline)
		out, err := w.Invoke(cctx, slot, b)
		cancel()
		if err == nil {
			err = f.check(slot, out)
		}
		if err != nil {
			rep.Slots = append(rep.Slots, Check{Name: slot, Detail: err.Error()})
			return refuse("%s: %v", slot, err)
		}
		rep.Slots = append(rep.Slots, Check{Name: slot, OK: true})
	}
	// The release's [hooks] binding: the slots it requires answer (and are
	// bound), the observers it names exist.
	if err := hooks.CheckCandidate(ctx, w, s.releases.Tree(release)); err != nil {
		rep.Slots = append(rep.Slots, Check{Name: "[hooks]", Detail: err.Error()})
		return refuse("%v", err)
	}

	rstart := time.Now()
	s.hooks.Flush() // the invocations still batched in memory are replayed too
	for _, slot := range suite.Slots {
		if _, known := slotFixtures[slot]; !known {
			continue
		}
		recs, err := s.store.ReplayableInvocations(ctx, session, slot, ReplayN)
		if err != nil {
			return refuse("replay: %v", err)
		}
		for _, r := range recs {
			rep.Replay.Replayed[slot]++
			cctx, cancel := context.WithTimeout(ctx, replayDeadline)
			out, err := w.Invoke(cctx, slot, r.Input)
			cancel()
			if err == nil && sameJSON(out, r.Result) {
				continue
			}
			rep.Replay.Changed[slot]++
			if len(rep.Replay.Changes) < maxChangesListed {
				c := Change{Invocation: r.ID, Slot: slot, At: r.At, Release: r.Release, Before: r.Result, After: out}
				if err != nil {
					c.Error, c.After = err.Error(), nil
				}
				rep.Replay.Changes = append(rep.Replay.Changes, c)
			}
			if errors.Is(err, worker.ErrDead) {
				return refuse("replay: %s invocation %d killed its hook worker: %v", slot, r.ID, err)
			}
		}
	}
	rep.Replay.TookMS = ms(time.Since(rstart))
	rep.OK, ok = true, true
	rep.TookMS = ms(time.Since(start))
	return rep, w, nil
}

// sameJSON compares two JSON documents by value (key order and spacing aside).
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// record stores rep with release for session; a failure to store is
// logged, never a reason to refuse or to accept.
func (s *Service) record(ctx context.Context, session string, rep Report) {
	b, err := json.Marshal(rep)
	if err == nil {
		err = s.store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
			return tx.RecordValidation(session, rep.Release, rep.OK, b)
		})
	}
	if err != nil {
		s.log.Error("store the validation report", "session", session, "release", rep.Release, "error", err)
	}
}

// runTests runs the candidate's own tests (tests/ in its tree, unittest) in
// a contained command, with bytecode off. Their outcome is recorded in the
// report; it refuses nothing (the candidate could have edited them).
func (s *Service) runTests(ctx context.Context, session, release string) OwnTests {
	tree := s.releases.Tree(release)
	if fi, err := os.Stat(filepath.Join(tree, "tests")); err != nil || !fi.IsDir() {
		return OwnTests{}
	}
	cfg := s.hooks.Config()
	res, err := worker.RunCommand(ctx, worker.CommandSpec{
		Kernel: cfg.Kernel, Placer: cfg.Placer, Limits: cfg.Limits, Sandbox: cfg.Sandbox, Session: session, Seq: nextCommand(),
		Argv: []string{cfg.Python, "-S", "-m", "unittest", "discover", "-s", "tests", "-t", "."}, // as the hooks run: standard library only
		Dir:  tree, Env: map[string]string{"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": cfg.RuntimeSrc},
		Timeout: TestTimeout, MaxOutput: 64 << 10,
	})
	if err != nil {
		return OwnTests{Present: true, Error: "its tests could not run: " + err.Error()}
	}
	out := string(res.Stderr) + string(res.Stdout)
	if len(out) > 2000 {
		out = "…" + out[len(out)-2000:]
	}
	return OwnTests{Present: true, Passed: res.ExitCode == 0, ExitCode: res.ExitCode, Tail: out}
}
