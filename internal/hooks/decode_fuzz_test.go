package hooks

import (
	"encoding/json"
	"os"
	"testing"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
)

// FuzzHookAnswers: whatever a hook worker answers, the host's decoders never
// panic, and what they accept keeps every bound the host relies on.
func FuzzHookAnswers(f *testing.F) {
	f.Add([]byte(`{"state":{"n":1},"commands":[{"op":"local.send","args":{"text":"hi"}}]}`))
	f.Add([]byte(`{"decision":"defer","seconds":5,"guidance":"be brief","reason":"r"}`))
	f.Add([]byte(`{"decision":"wait","seconds":-1}`))
	f.Add([]byte(`{"additions":["a","b"],"parts":["x"],"text":"t"}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"admit":true,"priority":1,"reason":"r","host":"label:gpu"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if a, err := decodeAnswer(data); err == nil {
			if len(a.Commands) > MaxCommands || len(a.State) > store.MaxHookState || (a.State != nil && !json.Valid(a.State)) {
				t.Fatalf("accepted an answer out of bounds: %d commands, %d bytes of state", len(a.Commands), len(a.State))
			}
		}
		in := PrepareTurnInput{Inputs: []TurnInputRef{{ID: 1, SourceKind: "operator"}}}
		if p, err := decodeTurnPrep(in, data); err == nil {
			if p.Defer != 0 || len(p.Guidance) > MaxGuidance || !utf8.ValidString(p.Guidance) {
				t.Fatalf("accepted %+v (operator input deferred, or guidance out of bounds)", p)
			}
		}
		if n, err := decodeNext(data); err == nil {
			if n.Seconds != nil && (*n.Seconds <= 0 || *n.Seconds > MaxNextWait) {
				t.Fatalf("accepted a wait of %v s", *n.Seconds)
			}
		}
		var jp jobs.Plan
		if decodeJobPlan(data, &jp) == nil && jp.Host != nil && (*jp.Host == "" || len(*jp.Host) > MaxPlanHost || !utf8.ValidString(*jp.Host)) {
			t.Fatalf("job.plan: accepted host %q", *jp.Host)
		}
		decodeVerdict(SlotExecutionReview, data)
	})
}

// FuzzBinding: any settings.toml [hooks] table either is refused or names
// only known slots, in bounds.
func FuzzBinding(f *testing.F) {
	f.Add([]byte("[hooks]\nrequired = [\"execution.review\"]\n[hooks.transforms]\n\"delivery.prepare\" = [\"delivery.prepare\"]\n"))
	f.Add([]byte("[[hooks.observers]]\nhandler = \"a.b\"\nevents = [\"input.accepted\"]\nstate_version = 1\n"))
	f.Add([]byte("[hooks]\nrequired = [\"nope\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := writeFile(dir+"/settings.toml", data); err != nil {
			t.Skip()
		}
		b, err := ReadBinding(dir)
		if err != nil {
			return
		}
		for slot, chain := range b.Transforms {
			if s, ok := Lookup(slot); !ok || s.Kind != KindTransform || len(chain) > maxChain {
				t.Fatalf("accepted transforms %q: %v", slot, chain)
			}
		}
		if len(b.Observers) > maxObservers {
			t.Fatalf("accepted %d observers", len(b.Observers))
		}
	})
}

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }
