package daemon

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// editNext is a cell that replaces turn.next with one that ends every
// attempt after its first step with cells, tests it with hooks.test,
// and activates the hook-only release.
const editNext = `kept = 'workbench state'
d = await behavior.draft()
await d.write("klbr_hooks/brief.py", '''
def next_step(inp):
    if not isinstance(inp, dict) or "steps" not in inp:
        raise ValueError("turn.next input")
    return {"decision": "end", "reason": "one step of cells is enough"}
''')
await hooks.bind(d, "turn.next", "brief", "next_step")
pub = await behavior.publish(d)
t = await hooks.test("turn.next", {"session": "default", "attempt": 1, "steps": 1, "tokens": 0, "calls": 1, "pending": 0, "budgets": {}}, release=pub.release)
a = await behavior.activate(pub.release, reason="shorter turns")
print(pub.kind, t.result["decision"], t.valid, a.kind)`

// "Self-edit the policy, retain the workbench": the agent changes turn.next
// from a cell, tests it with hooks.test and activates a hook-only release;
// its globals survive, the running attempt keeps its old policy, and the
// next attempt ends when the new policy says so.
func TestSelfEditThePolicyRetainTheWorkbench(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Text: "I will make my turns shorter.", Calls: []modeltest.Call{{ID: "e1", Code: editNext}}},
		// Still the old policy (continue): the attempt goes on.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "e2", Code: "print(kept)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w1", Code: "await runtime.wait(None, reason='done for now')"}}},
		// The next attempt runs under the new policy: it ends after this step.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "e3", Code: "print('under the new policy', kept)"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Text: "an extra step the new turn.next should have prevented"}
	})
	a := startAgent(t, model, "")
	a.send("make your turns shorter")
	a.eventually("the first attempt waits", func() bool { return model.Count() == 3 && a.session().State == store.StateWaiting })
	cells := a.kinds(store.LaneCell, "cell.finished")
	if len(cells) != 3 || !strings.Contains(string(cells[0].Content), "hooks end True hooks") ||
		!strings.Contains(string(cells[1].Content), "workbench state") {
		t.Fatalf("cells: %v\n%s", cells, a.dump())
	}
	a.send("and now?")
	a.eventually("the second attempt ends by turn.next", func() bool {
		s := a.session()
		return s.State == store.StateReady && s.Attempt != nil && strings.Contains(s.Attempt.Outcome, "turn.next")
	})
	if n := model.Count(); n != 4 {
		t.Fatalf("%d model requests, want 4: the new turn.next ends the attempt after its cells", n)
	}
	if c := a.kinds(store.LaneCell, "cell.finished"); len(c) != 4 || !strings.Contains(string(c[3].Content), "under the new policy workbench state") {
		t.Fatalf("the globals did not survive the hook-only activation: %v", c)
	}
}

// execution.review holds a cell: it never runs, and the model sees a held
// result with the reason.
func TestExecutionReviewHoldsACell(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: `d = await behavior.draft()
await d.write("klbr_hooks/careful.py", '''
def review(inp):
    if not isinstance(inp, dict) or not isinstance(inp.get("code"), str):
        raise ValueError("execution.review input")
    if "forbidden" in inp["code"]:
        return {"decision": "hold", "reason": "no forbidden cells"}
    return {"decision": "allow", "reason": "fine"}
''')
await hooks.bind(d, "execution.review", "careful", "review")
await behavior.activate((await behavior.publish(d)).release)`}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w1", Code: "await runtime.wait(None, reason='activated')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "print('forbidden ran')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w2", Code: "await runtime.wait(None, reason='it was held')"}}},
	)
	a := startAgent(t, model, "")
	a.send("be careful")
	a.eventually("the activation", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	a.send("try the forbidden cell")
	a.eventually("the held cell's answer", func() bool { return model.Count() == 4 })
	for _, c := range a.kinds(store.LaneCell, "cell.finished") {
		if strings.Contains(string(c.Content), "forbidden ran") {
			t.Fatalf("a held cell ran: %s", c.Content)
		}
	}
	msgs := model.Requests()[3].Messages
	last := content(msgs[len(msgs)-1])
	if !strings.Contains(last, "status: held") || !strings.Contains(last, "no forbidden cells") {
		t.Fatalf("the model saw %q for the held cell", last)
	}
}

// A delivery.prepare that splits a 5,000-character Discord message sends
// three messages, each with its own receipt (the shipped default does).
func TestDeliveryPrepareSplitsALongDiscordMessage(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	long := strings.Repeat("lorem ipsum dolor sit amet ", 200)[:5000]
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "l1", Code: "r = await (await discord.current()).send(" + pyQuote(long) + ")\n" +
			"print(len(r.parts), [p.state for p in r.parts], len({p.effect_id for p in r.parts}), r.delivered)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "l2", Code: "await runtime.wait(None, reason='said it')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8101", "80", "", "5", "tell me everything"))
	a.eventually("three messages", func() bool { return len(fake.Sent()) == 3 })
	total := 0
	for _, s := range fake.Sent() {
		if len(s.Content) > 2000 {
			t.Fatalf("a part of %d bytes", len(s.Content))
		}
		total += len(s.Content)
	}
	if total < 4990 {
		t.Fatalf("the parts hold %d bytes of 5000", total)
	}
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), `"tool_call_id":"l1"`) { // not the next cell's (l2)
				cell = string(r.Content)
			}
		}
		return cell != ""
	})
	if !strings.Contains(cell, `3 ['confirmed', 'confirmed', 'confirmed'] 3 True`) {
		t.Fatalf("the receipts: %s", cell)
	}
	if n := len(a.kinds(store.LaneSpeech, "discord.sent")); n != 3 {
		t.Fatalf("%d discord.sent records, want 3", n)
	}
}

func pyQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "\\'") + "'" }

// breakHooks is a cell that activates a release whose turn.prepare raises,
// turn.next hangs, execution.review raises, and whose context.prepare and
// result.present answer nonsense. They behave for the candidate check's
// example inputs (session "check"), or it would refuse the release, and its
// own slot tests are emptied.
const breakHooks = `d = await behavior.draft()
await d.write("klbr_hooks/bad.py", '''
import time
def prepare(inp):
    if inp.get("session") == "check":
        return {"decision": "start", "reason": "fine for the check"}
    raise RuntimeError("turn.prepare bug")
def next_step(inp):
    if inp.get("session") == "check":
        return {"decision": "continue", "reason": "fine for the check"}
    time.sleep(3)
    return {"decision": "end", "reason": "too late"}
def review(inp):
    if inp.get("session") == "check":
        return {"decision": "allow", "reason": "fine for the check"}
    raise RuntimeError("execution.review bug")
def present(inp):
    return {"text": 42}
def context(inp):
    return {"additions": "not a list"}
''')
for slot, fn in (("turn.prepare", "prepare"), ("turn.next", "next_step"), ("execution.review", "review"),
                 ("result.present", "present"), ("context.prepare", "context")):
    await hooks.bind(d, slot, "bad", fn)
await d.write("tests/test_slots.py", "")
await behavior.activate((await behavior.publish(d)).release, reason="broken on purpose")
await runtime.wait(None, reason='broke my hooks')`

// Every new slot of the loop failing, hanging or answering nonsense at
// once: the loop goes on with the host's defaults (the cell runs, the model
// sees the host's rendering, the attempt continues), status answers
// meanwhile and counts the fallbacks.
func TestBrokenHooksFallBackInTheLoop(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "b1", Code: breakHooks}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "b2", Code: "print('ran despite the hooks')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "b3", Code: "await runtime.wait(None, reason='done')"}}},
	)
	a := startAgent(t, model, "")
	a.send("break your hooks")
	a.eventually("the broken release is active", func() bool { return model.Count() == 1 && a.session().State == store.StateWaiting })
	a.send("go on")
	a.eventually("the second step", func() bool { return model.Count() >= 2 })
	// While turn.next hangs, the operator's controls answer.
	if _, err := a.c.Status(a.t.Context()); err != nil {
		t.Fatalf("status while a hook hangs: %v", err)
	}
	a.eventually("the third request and the wait", func() bool { return model.Count() == 3 && a.session().State == store.StateWaiting })
	msgs := model.Requests()[2].Messages
	last := content(msgs[len(msgs)-1])
	if !strings.Contains(last, "status: ok") || !strings.Contains(last, "ran despite the hooks") {
		t.Fatalf("the model saw %q for the cell", last)
	}
	for _, m := range msgs {
		if strings.Contains(content(m), "[klbr context.prepare]") {
			t.Fatalf("a nonsense context.prepare reached the request: %q", content(m))
		}
	}
	st, err := a.c.Status(a.t.Context())
	if err != nil || st.Hooks == nil {
		t.Fatalf("status: %+v %v", st.Hooks, err)
	}
	fell := map[string]int64{}
	for _, s := range st.Hooks.Slots {
		fell[s.Slot] = s.Fallbacks
	}
	for _, slot := range []string{"turn.prepare", "turn.next", "execution.review", "result.present", "context.prepare"} {
		if fell[slot] == 0 {
			t.Errorf("%s: no fallback counted (%v)", slot, fell)
		}
	}
}

// Discord counts a message's length in Unicode code points (2,000), not in
// bytes: 1,999 CJK characters (5,997 bytes) are one message, and 2,001
// emoji (one code point, four bytes each) are two, each within the limit.
func TestDiscordLimitCountsCharactersNotBytes(t *testing.T) {
	cjk := strings.Repeat("漢", 1999)
	emoji := strings.Repeat("😀", 2001)
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "c = await discord.current()\n" +
			"r = await c.send('" + cjk + "')\nprint('cjk', len(getattr(r, 'parts', None) or [r]), r.delivered)\n" +
			"r = await c.send('" + emoji + "')\nprint('emoji', len(r.parts), [p.state for p in r.parts])"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None, reason='said it')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8201", "82", "", "5", "write long"))
	a.eventually("three messages", func() bool { return len(fake.Sent()) == 3 })
	sent := fake.Sent()
	if sent[0].Content != cjk {
		t.Fatalf("the CJK text went out as %d characters, want one message of 1999", utf8.RuneCountInString(sent[0].Content))
	}
	if sent[1].Content+sent[2].Content != emoji {
		t.Fatalf("the emoji parts do not make the text: %d + %d characters", utf8.RuneCountInString(sent[1].Content), utf8.RuneCountInString(sent[2].Content))
	}
	for _, s := range sent {
		if n := utf8.RuneCountInString(s.Content); n > 2000 {
			t.Fatalf("a part of %d characters", n)
		}
	}
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), "emoji") {
				cell = string(r.Content)
			}
		}
		return cell != ""
	})
	if !strings.Contains(cell, "cjk 1 True") || !strings.Contains(cell, "emoji 2 ['confirmed', 'confirmed']") {
		t.Fatalf("the cell saw %s", cell)
	}
}
