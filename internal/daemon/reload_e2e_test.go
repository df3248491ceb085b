package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// waitReply answers a turn and waits for the next input.
var waitReply = modeltest.Reply{Text: "noted", Calls: []modeltest.Call{{ID: "w", Code: "await runtime.wait(None)"}}}

// twoRoutes is a klbr.toml with routes main (at a) and spare (at b), the
// agent on route; extra is appended.
func twoRoutes(a, b *modeltest.Server, route, extra string) string {
	return fmt.Sprintf("[agent]\nroute = %q\nretry_backoff_ms = 50\n\n[routes.main]\nurl = %q\nmodel = \"fake-a\"\ntimeout_seconds = 30\n\n"+
		"[routes.spare]\nurl = %q\nmodel = \"fake-b\"\ntimeout_seconds = 30\n%s", route, a.URL(), b.URL(), extra)
}

func (a *agent) writeConfig(body string) {
	a.t.Helper()
	if err := os.WriteFile(filepath.Join(a.data, "klbr.toml"), []byte(body), 0o600); err != nil {
		a.t.Fatal(err)
	}
}

func (a *agent) agentLine() string {
	a.t.Helper()
	st, err := a.c.Status(a.t.Context())
	if err != nil {
		a.t.Fatal(err)
	}
	return st.Agent
}

// A reload moves the agent to another route: the next model request goes
// there, status says so; a file that does not parse is refused with the
// parser's error and the route in force keeps serving; a change only a
// restart applies is named.
func TestReloadChangesTheRoute(t *testing.T) {
	modelA, modelB := modeltest.New(), modeltest.New()
	defer modelA.Close()
	defer modelB.Close()
	modelA.Then(waitReply)
	modelB.Then(waitReply, waitReply)
	a := startAgent(t, modelA, "")
	a.send("one")
	a.eventually("route main answered", func() bool { return modelA.Count() == 1 && a.session().State == store.StateWaiting })

	a.writeConfig(twoRoutes(modelA, modelB, "spare", "\n[jobs]\nmax_concurrent = 3\n"))
	got, err := a.c.Reload(t.Context())
	if err != nil {
		t.Fatalf("reload: %v\n%s", err, a.d)
	}
	if !slices.ContainsFunc(got.Applied, func(s string) bool { return strings.Contains(s, "agent route: main -> spare") }) {
		t.Fatalf("reload applied %q, want the agent route named", got.Applied)
	}
	if !slices.ContainsFunc(got.Restart, func(s string) bool { return strings.HasPrefix(s, "[jobs]") }) {
		t.Fatalf("reload's restart list %q does not name [jobs]", got.Restart)
	}
	if line := a.agentLine(); !strings.HasPrefix(line, "route spare (fake-b)") || got.Agent != line {
		t.Fatalf("status agent %q, reload's answer %q: want route spare in both", line, got.Agent)
	}
	a.send("two")
	a.eventually("route spare answered", func() bool { return modelB.Count() == 1 })
	if modelA.Count() != 1 {
		t.Fatalf("route main got %d requests after the reload, want 1 (before it)", modelA.Count())
	}

	a.writeConfig("[agent\nroute = \"main\"\n")
	_, err = a.c.Reload(t.Context())
	if err == nil || !strings.Contains(err.Error(), "klbr.toml") || !strings.Contains(err.Error(), "running configuration stays") {
		t.Fatalf("a broken klbr.toml: reload answered %v, want the parser's error and the refusal", err)
	}
	if line := a.agentLine(); !strings.HasPrefix(line, "route spare") {
		t.Fatalf("after a refused reload status says %q, want route spare still", line)
	}
	a.eventually("the session waits", a.state(store.StateWaiting))
	a.send("three")
	a.eventually("route spare still answers", func() bool { return modelB.Count() == 2 })
	if modelA.Count() != 1 {
		t.Fatalf("route main got a request after a refused reload")
	}
}

// SIGHUP (systemctl reload klbr-core) does what klbr-core reload does.
func TestSIGHUPReloads(t *testing.T) {
	modelA, modelB := modeltest.New(), modeltest.New()
	defer modelA.Close()
	defer modelB.Close()
	modelB.Then(waitReply)
	a := startAgent(t, modelA, "")
	a.writeConfig("[agent\n")
	if err := a.d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	a.eventually("the refusal is logged", func() bool { return strings.Contains(a.d.String(), "reload refused") })
	if line := a.agentLine(); !strings.HasPrefix(line, "route main") {
		t.Fatalf("after a refused SIGHUP status says %q, want route main", line)
	}

	a.writeConfig(twoRoutes(modelA, modelB, "spare", "\n[limits]\ntasks_max = 77\n"))
	if err := a.d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	a.eventually("status shows route spare", func() bool { return strings.HasPrefix(a.agentLine(), "route spare") })
	if log := a.d.String(); !strings.Contains(log, "klbr.toml reloaded") || !strings.Contains(log, "[limits]") {
		t.Fatalf("the daemon log does not name the reload and [limits] as needing a restart:\n%s", log)
	}
	a.send("hello")
	a.eventually("route spare answered", func() bool { return modelB.Count() == 1 })
	if modelA.Count() != 0 {
		t.Fatalf("route main got %d requests, want none", modelA.Count())
	}
}

// With no route configured, the agent runs on seed 000's defaults
// (localhost:8001, then :8002, :8003) and says so; when nothing answers
// there, the error says what to start or configure, and the input is kept.
// A reload that configures a route replaces the defaults live, without a
// restart, and the agent answers the input kept while nobody answered.
func TestReloadStartsTheAgent(t *testing.T) {
	requirePython(t)
	for _, port := range []string{"8001", "8002", "8003"} {
		if c, err := net.DialTimeout("tcp", "localhost:"+port, time.Second); err == nil {
			c.Close()
			citest.SkipOrFail(t, "something listens on localhost:"+port+" (a seed default): this test needs nothing to answer there")
		}
	}
	model := modeltest.New()
	defer model.Close()
	model.Then(waitReply, waitReply)
	data, env := instance(t)
	conf := filepath.Join(data, "klbr.toml")
	if err := os.WriteFile(conf, []byte("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)
	a := &agent{t: t, model: model, data: data, env: env}
	a.start()
	if line := a.agentLine(); !strings.HasPrefix(line, "route main (the server's model), fallback seed-8002, seed-8003") ||
		!strings.Contains(line, "no route configured: using seed defaults http://localhost:8001/v1 (then http://localhost:8002/v1, http://localhost:8003/v1)") ||
		!strings.Contains(line, "[routes.main] in "+conf) {
		t.Fatalf("status agent %q without a route, want the seed defaults named", line)
	}
	a.send("kept while nobody answers")
	a.eventually("the route error says what to start", func() bool {
		return strings.Contains(a.d.String(), "start an OpenAI-compatible server there (e.g. llama-server or vLLM on localhost:8001), or configure [routes.main] (url, model) in "+conf)
	})
	if s := a.session(); s.State == store.StateWaiting {
		t.Fatalf("session %+v: the input was dropped", s)
	}

	a.writeConfig(fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 30\n", model.URL()))
	got, err := a.c.Reload(t.Context())
	if err != nil {
		t.Fatalf("reload: %v\n%s", err, a.d)
	}
	if !slices.ContainsFunc(got.Applied, func(s string) bool { return strings.Contains(s, "routes:") }) || len(got.Restart) != 0 {
		t.Fatalf("reload applied %q and needs a restart for %q; want the routes replaced and nothing waiting for a restart", got.Applied, got.Restart)
	}
	if line := a.agentLine(); line != "route main (fake)" || got.Agent != line {
		t.Fatalf("status agent %q, reload's answer %q: want route main alone in both", line, got.Agent)
	}
	a.eventually("the kept input is answered", func() bool { return model.Count() == 1 && a.session().State == store.StateWaiting })
	if req := model.Requests()[0]; !strings.Contains(fmt.Sprint(req.Messages), "kept while nobody answers") {
		t.Fatalf("the first request does not carry the kept input: %v", req.Messages)
	}
	a.send("after")
	a.eventually("the next input is answered", func() bool { return model.Count() == 2 })
}

// A reload changes the worker hosts live: a host added is listed at once,
// a removed one is no longer listed and a new job there is refused naming
// it, and the answer says so; nothing about [hosts] waits for a restart.
// The hosts are never dialled (port 1 refuses at once).
func TestReloadChangesTheHosts(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "try:\n    await jobs.run(['true'], host='b')\n" +
		"except Exception as e:\n    print('refused' + ':', str(e).replace('\"', ''))\nawait runtime.wait(None)"}}}, waitReply)
	dir := t.TempDir()
	id, kh := filepath.Join(dir, "id"), filepath.Join(dir, "known_hosts")
	for _, f := range []string{id, kh} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	host := func(name string) string {
		return fmt.Sprintf("\n[hosts.%s]\nssh = \"klbr@127.0.0.1:1\"\nidentity_file = %q\nknown_hosts_file = %q\n", name, id, kh)
	}
	a := startAgentTOML(t, "", route("main", model, "")+host("a")+host("b"))
	hostNames := func() []string {
		st, err := a.c.Status(t.Context())
		if err != nil || st.Jobs == nil {
			t.Fatalf("status: %+v %v", st, err)
		}
		var out []string
		for _, h := range st.Jobs.Hosts {
			out = append(out, h.Name)
		}
		return out
	}
	if got := hostNames(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("hosts at the start: %v", got)
	}
	a.writeConfig("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n\n" + route("main", model, "") + host("a") + host("c"))
	got, err := a.c.Reload(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if applied := strings.Join(got.Applied, "\n"); !strings.Contains(applied, "[hosts]: added c") || !strings.Contains(applied, "removed") || !strings.Contains(applied, " b") {
		t.Fatalf("reload applied %q, want c added and b removed", got.Applied)
	}
	for _, r := range got.Restart {
		if strings.Contains(r, "[hosts]") {
			t.Fatalf("reload names [hosts] as needing a restart: %q", got.Restart)
		}
	}
	if got := hostNames(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("hosts after the reload: %v, want a and c", got)
	}
	a.send("run it on b")
	a.eventually("the job on b is refused", func() bool { return a.cellSaid("default", "refused: ") })
	if !a.cellSaid("default", "no such host: b (the hosts are a, c)") {
		t.Fatalf("the refusal does not name b and the hosts there are:\n%s", a.dump())
	}
}
