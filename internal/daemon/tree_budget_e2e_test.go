package daemon

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// inFlight counts the model requests a scripted server holds at once.
type inFlight struct {
	mu       sync.Mutex
	now, max int
	started  int
}

// hold is a Hold channel that opens after d, counting the request in
// flight until then.
func (f *inFlight) hold(d time.Duration) <-chan struct{} {
	f.mu.Lock()
	f.now++
	f.started++
	f.max = max(f.max, f.now)
	f.mu.Unlock()
	ch := make(chan struct{})
	time.AfterFunc(d, func() {
		f.mu.Lock()
		f.now--
		f.mu.Unlock()
		close(ch)
	})
	return ch
}

func (f *inFlight) figures() (started, most int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started, f.max
}

// Ten children started at once under a tree budget of $0.10 overshoot it
// by no more than the requests in flight: child-1 (budget.usd 0.10, which
// covers its subtree) spawns ten children at once, each of whose requests
// costs $0.03 at the route's price and is held two seconds at the model.
// Each request reserves its largest cost (reserve_output_tokens at the
// output price: $0.03) against the tree's budget before it starts, so no
// more than ceil(0.10/0.03) = 4 are in flight at once and the tree spends
// less than $0.10 plus one request. Then child-1 ends failed naming
// budget.usd, its children are cancelled with it and it is told of each,
// the root is told once, and the ledger equals the recorded steps.
func TestTenChildrenUnderATreeBudget(t *testing.T) {
	const (
		budget = 0.10
		cost   = 0.03 // 3000 completion tokens at $10 per million; the prompt is free
		kids   = 10
	)
	model := modeltest.New()
	defer model.Close()
	var flight inFlight
	answers := answerBySession(model, map[string]func(int, modeltest.Request) modeltest.Reply{
		"default": func(step int, _ modeltest.Request) modeltest.Reply {
			if step == 1 {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: fmt.Sprintf("child = await agents.spawn(task='lead', budget={'usd': %v})\n", budget) +
					"await runtime.wait(None, reason=f'child {child.id}')"}}}
			}
			return modeltest.Reply{Text: "Told.", Calls: []modeltest.Call{{ID: fmt.Sprintf("r%d", step), Code: "await runtime.wait(None)"}}}
		},
		"child-1": func(step int, _ modeltest.Request) modeltest.Reply {
			if step == 1 {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: fmt.Sprintf("for i in range(%d):\n    await agents.spawn(task=f'part {i}')\n", kids) +
					"await runtime.wait(None, reason='parts')"}}}
			}
			return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("k%d", step), Code: "await runtime.wait(None, reason='parts')"}}}
		},
	})
	part := func(step int, _ modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Usage: map[string]any{"prompt_tokens": 100, "completion_tokens": 3000, "total_tokens": 3100},
			Hold: flight.hold(2 * time.Second), Calls: []modeltest.Call{{ID: fmt.Sprintf("p%d", step), Code: "print('part')"}}}
	}
	for i := 2; i <= kids+1; i++ {
		answers.scripts[store.ChildSessionID(int64(i))] = part
	}
	a := startAgentsAgent(t, model, "reserve_output_tokens = 3000\n"+
		fmt.Sprintf("[agents]\nmax_concurrent = %d\nmax_descendants = 32\nmodel_slots = 32\n", kids)+
		"[routes.main.price]\ninput = 0\noutput = 10\n")
	a.send("fan out under a budget")
	a.eventuallyIn("default", "the root was told of child-1's end", func() bool { return answers.requests("default") >= 2 })
	a.eventually("the root waits again", a.state(store.StateWaiting))

	// Nothing dead-ends: every job has ended, each parent told once of each child.
	j, err := a.c.Job(t.Context(), 1)
	if err != nil || j.State != store.JobFailed || !strings.Contains(j.Error, "(budget.usd)") {
		t.Fatalf("child-1's job %+v, %v; want failed naming budget.usd", j, err)
	}
	if in := a.jobInputs(); len(in) != 1 || !strings.HasPrefix(in[0], "[klbr] child 1 failed (session child-1, budget exhausted). Error: budget exhausted: spend ") {
		t.Fatalf("the root's notifications %q, want one naming child-1's budget", in)
	}
	told := 0
	for _, r := range a.sessionRecords("child-1") {
		if r.Lane == store.LaneInput && r.Kind == "job.input" && strings.Contains(string(r.Content), "[klbr] child ") {
			told++
		}
	}
	for id := int64(2); id <= kids+1; id++ {
		g, err := a.c.Job(t.Context(), id)
		if err != nil || (g.State != store.JobCancelled && g.State != store.JobFailed) {
			t.Fatalf("child %d: %+v, %v; want ended with child-1", id, g, err)
		}
	}
	if told != kids {
		t.Fatalf("child-1 was told of %d children's ends, want %d", told, kids)
	}

	// The figures: what the tree spent against the requests in flight.
	started, most := flight.figures()
	sp, err := a.c.Spend(t.Context(), "tree", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	bySession, err := a.c.Spend(t.Context(), "session", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	spent := 0.0
	for _, g := range bySession.Groups {
		if g.Key != "default" {
			spent += g.USD
		}
	}
	bound := budget + float64(most)*cost
	t.Logf("tree budget $%.2f: %d requests started under it, at most %d in flight at once; spent $%.4f, bound $%.2f + %d × $%.2f = $%.4f",
		budget, started, most, spent, budget, most, cost, bound)
	if spent > bound+1e-9 {
		t.Fatalf("the tree spent $%.4f, past its budget by more than the %d requests in flight ($%.4f)", spent, most, bound)
	}
	// The reservations: a request starts only while the tree's spend plus
	// the largest cost of its requests in flight is under the budget.
	if reserved := int(math.Ceil(budget/cost - 1e-9)); most > reserved {
		t.Fatalf("%d requests of the tree in flight at once; its budget's reservations admit %d", most, reserved)
	}
	if spent >= budget+cost-1e-9 {
		t.Fatalf("the tree spent $%.4f: past its budget by a request or more", spent)
	}

	// The ledger is the recorded steps.
	rows, steps, ledgerTok, stepTok, usd := ledgerAgainstSteps(t, a.data)
	priced := ledgerTok / 3100 // the children's requests: 3100 tokens each, the others report none
	if ledgerTok != stepTok || ledgerTok%3100 != 0 || math.Abs(usd-float64(priced)*cost) > 1e-9 || math.Abs(usd-sp.Total.USD) > 1e-9 {
		t.Fatalf("ledger %d rows, %d tokens, $%v; steps %d with %d tokens; GET /v1/spend $%v", rows, ledgerTok, usd, steps, stepTok, sp.Total.USD)
	}
	if math.Abs(usd-spent) > 1e-9 {
		t.Fatalf("the ledger holds $%v, the tree $%v: the root spent nothing", usd, spent)
	}
}
