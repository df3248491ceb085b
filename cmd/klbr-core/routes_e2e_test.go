package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// TestRoutesDoctorAndRouteTest: doctor checks every route as a new user's
// mistakes need (a server that refuses connections, a key that is not set,
// a model the server does not serve), and route test sends one request.
func TestRoutesDoctorAndRouteTest(t *testing.T) {
	const key = "sk-e2e-SECRET-77"
	good := modeltest.New()
	t.Cleanup(good.Close)
	good.RequireKey(key)
	good.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Text: "Hello, I am fake.", Usage: map[string]any{"prompt_tokens": 21, "completion_tokens": 6, "total_tokens": 27}}
	})
	other := modeltest.New()
	t.Cleanup(other.Close)
	other.ListModels("other-model", "second")
	gone := modeltest.New()
	goneURL := gone.URL()
	gone.Close()

	in := newInstance(t)
	conf := filepath.Join(in.dir, "..", "klbr.toml")
	doc := fmt.Sprintf(`[agent]
route = "main"
fallback = ["down", "nokey"]

[routes.main]
url = %q
model = "fake"
api_key_env = "GOOD_KEY"

[routes.nokey]
url = %q
model = "fake"
api_key_env = "MISSING_KEY"

[routes.down]
url = %q
model = "fake"

[routes.wrong]
url = %q
model = "fake"
dialect = "vllm"

[routes.llama]
url = %q
model = "fake"
dialect = "llama.cpp"
`, good.URL(), good.URL(), goneURL, other.URL(), other.URL())
	if err := os.WriteFile(conf, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"KLBR_CONFIG=" + conf, "GOOD_KEY=" + key}
	out, errOut, err := in.run(env, "doctor")
	if err == nil {
		t.Fatalf("doctor passed with broken routes:\n%s", out)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[1] == "route" {
			lines[strings.TrimSuffix(f[2], ":")] = l
		}
	}
	for name, want := range map[string][]string{
		"main":  {"ok   route", "main (agent route): " + good.URL() + " serves fake (openai)"},
		"nokey": {"FAIL route", "api_key_env MISSING_KEY is not set or empty"},
		"down":  {"FAIL route", "down (fallback 1): the server does not answer", goneURL + "/models"},
		// A route nothing uses is a warning, whatever is wrong with it.
		"wrong": {"WARN route", `does not list model "fake" (it lists: other-model, second)`, "nothing uses it"},
		"llama": {"WARN route", `does not list model "fake"`, "llama.cpp serves the model it loaded"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[name], w) && !strings.Contains(out, w) {
				t.Errorf("route %s: want %q in\n%s", name, w, lines[name])
			}
		}
	}
	if strings.Contains(out+errOut, key) {
		t.Errorf("the key leaked into doctor's output")
	}

	// route test: one request, its reply, usage and latency.
	out, errOut, err = in.run(env, "route", "test", "main")
	if err != nil || !strings.Contains(out, "reply: Hello, I am fake.") || !strings.Contains(out, "usage: prompt 21, completion 6, total 27") ||
		!strings.Contains(out, "latency: ") {
		t.Fatalf("route test main: %v\n%s\n%s", err, out, errOut)
	}
	reqs := good.Requests()
	last := reqs[len(reqs)-1]
	if _, ok := last.Body["tools"]; ok || !last.Stream {
		t.Errorf("route test sent tools or did not stream: %v", last.Body)
	}
	out, _, err = in.run(env, "route", "test", "main", "--json")
	var rt map[string]any
	if err != nil || json.Unmarshal([]byte(out), &rt) != nil || rt["reply"] != "Hello, I am fake." || rt["dialect"] != "openai" {
		t.Errorf("route test --json: %v %s", err, out)
	}
	_, errOut, err = in.run(env, "route", "test", "down")
	if err == nil || !strings.Contains(errOut, goneURL+"/chat/completions") || !strings.Contains(errOut, "transient") {
		t.Errorf("route test down: %v %s", err, errOut)
	}
	if _, errOut, err = in.run(env, "route", "test", "nope"); err == nil || !strings.Contains(errOut, "no [routes.nope]") {
		t.Errorf("route test nope: %v %s", err, errOut)
	}
}
