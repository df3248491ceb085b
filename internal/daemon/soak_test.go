package daemon

import (
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// soakModel is the scripted route of the soak: a random mix of replies, a
// route that goes down (connections dropped, 503) or answers 400 on cue.
type soakModel struct {
	mu      sync.Mutex
	rng     *rand.Rand
	down    bool
	reject  int  // answer the next n requests 400
	final   bool // answer every request by sending and waiting
	replies map[string]int
	// sticky is a cell for every answer until cleared (soak_mix_test.go's
	// events set it).
	sticky string
}

func (m *soakModel) reply(n int) modeltest.Reply {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.down && n%2 == 0:
		m.replies["down-503"]++
		return modeltest.Reply{Status: 503, Body: `{"error":{"message":"restarting"}}`}
	case m.down:
		m.replies["down-drop"]++
		return modeltest.Reply{Drop: true}
	case m.reject > 0:
		m.reject--
		m.replies["400"]++
		return modeltest.Reply{Status: 400, Body: `{"error":{"message":"bad request"}}`}
	case m.final:
		m.replies["final"]++
		return modeltest.Reply{Usage: soakUsage(), Calls: []modeltest.Call{{Code: "await local.send('soak: final answer')\nawait runtime.wait(None)"}}}
	case m.sticky != "":
		m.replies["sticky"]++
		return modeltest.Reply{Usage: soakUsage(), Calls: []modeltest.Call{{Code: m.sticky}}}
	}
	k := m.rng.IntN(100)
	var code string
	switch {
	case k < 25:
		m.replies["local.send"]++
		code = fmt.Sprintf("await local.send('soak reply %d')\nawait runtime.wait(None, reason='soak')", n)
	case k < 45:
		m.replies["file+subprocess"]++
		code = fmt.Sprintf("import pathlib, subprocess\np = pathlib.Path('soak-%d.txt')\np.write_text('x' * 4096)\n"+
			"subprocess.run(['cat', str(p)], capture_output=True, check=True)\np.unlink()\n"+
			"subprocess.Popen(['sleep', '600'])\nawait runtime.wait(2, reason='file work')", n%50)
	case k < 65:
		m.replies["discord.send"]++
		code = fmt.Sprintf("try:\n    await (await discord.current()).send('soak %d')\nexcept discord.HostError:\n    await local.send('no discord target')\n"+
			"await runtime.wait(None)", n)
	case k < 75:
		m.replies["prose"]++
		return modeltest.Reply{Usage: soakUsage(), Text: "Thinking about it."}
	case k < 85:
		m.replies["wait 1s"]++
		code = "await runtime.wait(1, reason='poll once')"
	default:
		m.replies["slow cell"]++
		code = "import time\ntime.sleep(1.5)\nprint('slow')"
	}
	return modeltest.Reply{Usage: soakUsage(), Calls: []modeltest.Call{{Code: code}}}
}

func (m *soakModel) set(f func(m *soakModel)) { m.mu.Lock(); f(m); m.mu.Unlock() }

// procSample is a process figure read from /metrics.
type procSample struct{ goroutines, fds, rss float64 }

var metricLine = regexp.MustCompile(`(?m)^(go_goroutines|process_open_fds|process_resident_memory_bytes) ([0-9.e+]+)$`)

func (a *agent) sample() procSample {
	var s procSample
	for _, m := range metricLine.FindAllStringSubmatch(a.scrape(), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[1] {
		case "go_goroutines":
			s.goroutines = v
		case "process_open_fds":
			s.fds = v
		case "process_resident_memory_bytes":
			s.rss = v
		}
	}
	return s
}

// strays lists the processes that carry the soak's workspace in their
// environment (workers, kernels and what cells started) and whose ancestry
// does not reach alive (0: any such process is a stray).
func strays(workspace string, alive int) []string {
	ents, _ := os.ReadDir("/proc")
	ppid := map[int]int{}
	var ours []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
			f := strings.Fields(string(stat)[i+1:])
			if len(f) > 2 && f[0] != "Z" {
				ppid[pid], _ = strconv.Atoi(f[1])
			} else {
				continue
			}
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && strings.Contains(string(env), "\x00KLBR_WORKSPACE="+workspace+"\x00") {
			ours = append(ours, pid)
		}
	}
	var out []string
	for _, pid := range ours {
		p, ok := pid, false
		for range 64 {
			if p == alive && alive != 0 {
				ok = true
				break
			}
			if p <= 1 {
				break
			}
			p = ppid[p]
		}
		if !ok {
			cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	return out
}

// TestSoak runs klbr-core with the scripted model server and the Discord
// fake under a synthetic mix for KLBR_SOAK (a Go duration; `make soak`
// sets it from SOAK, default 3m): idle stretches, cells doing file work and
// subprocesses, ambient chatter, DMs and mentions, operator messages, route
// outages and 4xx answers, workbench kills, klbr-discord restarts and
// SIGKILL of klbr-core at random moments; and the second mix
// (soak_mix_test.go): spend caps hit and raised, reloads between two
// routes, Discord attachments read by a cell and, from soakHostsFrom on,
// remote jobs on a worker host. It prints a sample (RSS, open files,
// goroutines, WAL) about every minute. Then it checks the records and the
// fakes' logs (lost and duplicated inputs among them) and fails on any
// violation, printing the counts and the last incarnation's slopes.
func TestSoak(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("KLBR_SOAK"))
	if err != nil || dur <= 0 {
		t.Skip("KLBR_SOAK is not set to a duration: `make soak` (SOAK=3m by default, part of `make test`) runs the soak")
	}
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("KLBR_SOAK_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("soak: %s, seed %d (KLBR_SOAK_SEED reruns it)", dur, seed)
	rng := rand.New(rand.NewPCG(seed, 14))
	sm := &soakModel{rng: rand.New(rand.NewPCG(seed, 15)), replies: map[string]int{}}
	model, spare := modeltest.New(), modeltest.New()
	defer model.Close()
	defer spare.Close()
	model.Otherwise(sm.reply)
	spare.Otherwise(sm.reply)
	counts := map[string]int{}
	mix := &soakMix{t: t, sm: sm, models: map[string]*modeltest.Server{"main": model, "spare": spare}, route: "main",
		agent: "max_retry_backoff_ms = 2000\nmax_steps = 12\n", counts: counts}
	switch reason := hosttest.Missing(); {
	case dur < soakHostsFrom && os.Getenv("KLBR_SOAK_HOSTS") != "1":
		t.Logf("soak: no worker host below %s (KLBR_SOAK_HOSTS=1 boots one)", soakHostsFrom)
	case reason != "" && os.Getenv("CI") == "true":
		t.Fatalf("CI=true and the soak's worker host cannot boot: %s", reason)
	case reason != "":
		t.Logf("soak: no worker host: %s", reason)
	default:
		mix.host = hosttest.Start(t)
		mix.host.InstallKernel(t)
		t.Logf("soak: worker host lab at %s", mix.host.SSH())
	}
	requirePython(t)
	data, env := instance(t)
	conf := filepath.Join(data, "klbr.toml")
	if err := os.WriteFile(conf, []byte(mix.config("main")), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, model: model, data: data, env: append(env, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)}
	a.start()
	mix.a = a
	db := openRO(t, a.data)
	defer db.Close()
	t.Cleanup(func() {
		// A failed soak keeps its store for a look (before the directory goes).
		if t.Failed() {
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("klbr-soak-%d", seed))
			if err := os.CopyFS(keep, os.DirFS(a.data)); err == nil {
				t.Logf("the failed soak's data directory is kept in %s", keep)
			}
		}
	})
	workspace := ""
	for _, e := range a.env {
		if v, ok := strings.CutPrefix(e, "KLBR_WORKSPACE="); ok {
			workspace = v
		}
	}
	fake := discordtest.New("99")
	defer fake.Close()
	// klbr-discord's log, kept for a look at a lost message.
	dlogPath := filepath.Join(os.TempDir(), fmt.Sprintf("klbr-soak-%d-discord.log", seed))
	dlogFile, err := os.Create(dlogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer dlogFile.Close()
	dlog := slog.New(slog.NewTextHandler(dlogFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	stopDiscord := startTransportLog(t, fake, a.data, dlog)
	a.eventually("the gateway session", fake.Connected)

	var acked []int64
	var violations []string
	violate := func(format string, args ...any) {
		v := fmt.Sprintf(format, args...)
		violations = append(violations, v)
		t.Log("VIOLATION:", v)
	}
	mix.violate, mix.fake = violate, fake
	// The DMs and mentions that must be admitted once each: those the
	// gateway took, and those in a conversation the core knows (klbr-discord
	// reads those back from history when it starts).
	expect := map[string]string{} // message id: what it was, for a violation
	knownChannel := map[string]bool{}
	discordIn := func(kind, id, channel string, m map[string]any) {
		delivered := fake.Dispatch("MESSAGE_CREATE", m)
		if kind == "ambient" {
			return
		}
		if delivered || knownChannel[channel] {
			expect[id] = fmt.Sprintf("a %s in channel %s at %s, taken by the gateway %v", kind, channel, time.Now().UTC().Format("15:04:05.000"), delivered)
		}
		if delivered {
			knownChannel[channel] = true
		}
	}
	checkStrays := func(when string) {
		pid := a.d.cmd.Process.Pid
		// Give a killed tree a moment to go (the kernel's deadline, parent-death signals).
		deadline := time.Now().Add(5 * time.Second)
		s := strays(workspace, pid)
		for len(s) > 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			s = strays(workspace, pid)
		}
		if len(s) > 0 {
			violate("%s: %d processes outlived their workbench: %v", when, len(s), s)
		}
	}
	msgID := 700000
	send := func(kind string) {
		counts["in:"+kind]++
		msgID++
		id := strconv.Itoa(msgID)
		switch kind {
		case "operator":
			res, err := a.c.Send(t.Context(), "default", api.SendRequest{Text: "soak operator " + id, SourceKey: "soak-" + id})
			if err != nil {
				counts["operator send refused"]++
				return
			}
			acked = append(acked, res.ID)
		case "dm":
			ch := strconv.Itoa(40 + rng.IntN(3))
			discordIn(kind, id, ch, discordtest.Message(id, ch, "", strconv.Itoa(50+rng.IntN(3)), "soak dm "+id))
		case "mention":
			m := discordtest.Message(id, "60", "7", "51", "<@99> soak mention "+id)
			m["mentions"] = []any{map[string]any{"id": "99", "username": "klbr"}}
			discordIn(kind, id, "60", m)
		case "ambient":
			ch := strconv.Itoa(60 + rng.IntN(2))
			discordIn(kind, id, ch, discordtest.Message(id, ch, "7", "52", "soak chatter "+id))
		}
	}

	start := a.sample()
	began := time.Now()
	settleAt := time.Now().Add(dur * 2 / 3) // the last third: no more SIGKILLs of klbr-core, so its figures can be compared
	settled := false
	var early procSample
	// Periodic samples: printed as they are taken; the settled ones give
	// the last incarnation's slopes.
	every := min(max(dur/60, 5*time.Second), time.Minute)
	var lastSample time.Time
	var settledAt, settledRSS, settledFDs []float64
	var maxWAL int64
	takeSample := func() {
		lastSample = time.Now()
		p, wal := a.sample(), walBytes(a.data)
		maxWAL = max(maxWAL, wal)
		if settled {
			settledAt = append(settledAt, time.Since(began).Hours())
			settledRSS = append(settledRSS, p.rss/(1<<20))
			settledFDs = append(settledFDs, p.fds)
		}
		t.Logf("soak sample at %s: RSS %.1f MB, %.0f fds, %.0f goroutines, WAL %.2f MB, %d model requests, settled %v",
			time.Since(began).Round(time.Second), p.rss/(1<<20), p.fds, p.goroutines, float64(wal)/(1<<20), mix.requests(), settled)
	}
	// Each event of the second mix once at the start (so that the 3-minute
	// soak has them all), then a few in every 200 iterations.
	takeSample()
	mix.reload(&acked)
	msgID++
	mix.attachment(db, msgID, expect, &acked)
	mix.remoteJob(db, &acked)
	mix.spendCap(&acked) // last: the others spent something
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		if !settled && time.Now().After(settleAt) {
			settled = true
			early = a.sample()
		}
		if time.Since(lastSample) >= every {
			takeSample()
		}
		// The second mix: a few events in 200 iterations.
		switch j := rng.IntN(200); {
		case j < 1:
			mix.spendCap(&acked)
		case j < 2:
			mix.reload(&acked)
		case j < 3:
			msgID++
			mix.attachment(db, msgID, expect, &acked)
		case j < 4:
			mix.remoteJob(db, &acked)
		}
		k := rng.IntN(100)
		switch {
		case k < 15:
			counts["idle stretch"]++
			time.Sleep(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
		case k < 35:
			send("operator")
		case k < 50:
			send("dm")
		case k < 58:
			send("mention")
		case k < 75:
			for range 1 + rng.IntN(5) {
				send("ambient")
			}
		case k < 80:
			counts["route outage"]++
			sm.set(func(m *soakModel) { m.down = true })
			time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
			sm.set(func(m *soakModel) { m.down = false })
		case k < 84:
			counts["4xx answers"]++
			sm.set(func(m *soakModel) { m.reject = 1 + rng.IntN(2) })
		case k < 89:
			pid := a.d.cmd.Process.Pid
			killed := false
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
				cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				argv0, _, _ := strings.Cut(string(cmd), "\x00")
				if err == nil && strings.Contains(string(env), "\x00KLBR_ROLE=workbench\x00") && strings.HasPrefix(filepath.Base(argv0), "python") &&
					strings.Contains(string(env), "KLBR_WORKSPACE="+workspace+"\x00") {
					if p, err := strconv.Atoi(e.Name()); err == nil && p != pid {
						syscall.Kill(p, syscall.SIGKILL)
						killed = true
					}
				}
			}
			if killed {
				counts["workbench kill"]++
			}
		case k < 93:
			counts["klbr-discord restart"]++
			stopDiscord()
			time.Sleep(time.Duration(200+rng.IntN(1500)) * time.Millisecond)
			stopDiscord = startTransportLog(t, fake, a.data, dlog)
			t.Logf("soak: klbr-discord restarted at %s", time.Now().UTC().Format("15:04:05.000"))
		case k < 97 && !settled:
			counts["klbr-core SIGKILL"]++
			a.kill()
			checkStrays("after SIGKILL of klbr-core")
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
			a.start()
		default:
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		}
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
	}

	// Settle: the route up, every fake up; a last operator input must be
	// answered, and then nothing may be left without a disposition.
	sm.set(func(m *soakModel) { m.down, m.reject, m.final = false, 0, true })
	a.eventually("the gateway session after the soak", fake.Connected)
	if settled {
		checkStrays("at the end")
	}
	before := len(a.kinds(store.LaneSpeech, "local.sent"))
	a.send("soak: the final input")
	deadline := time.Now().Add(90 * time.Second)
	for len(a.kinds(store.LaneSpeech, "local.sent")) == before {
		if time.Now().After(deadline) {
			s := a.session()
			violate("the final operator input was not answered within 90 s: state %s (%s), retry %+v", s.State, s.StateReason, s.Retry)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	finalSample := a.sample()
	takeSample()

	disposition(t, db, acked, violate, counts)
	lost, dup := discordAdmitted(db, expect, 60*time.Second)
	for _, id := range lost {
		violate("Discord message %s (%s) was never admitted", id, expect[id])
	}
	for _, id := range dup {
		violate("Discord message %s was admitted more than once", id)
	}
	counts["lost inputs"] = len(lost)
	counts["duplicated inputs"] = len(dup)
	counts["discord DMs and mentions expected"] = len(expect)
	if maxWAL > 256<<20 {
		violate("the WAL reached %.1f MB", float64(maxWAL)/(1<<20))
	}
	seen := map[string]int{}
	for _, s := range fake.Sent() {
		if s.Nonce != "" {
			seen[s.Nonce]++
		}
	}
	for nonce, n := range seen {
		if n > 1 {
			violate("Discord message with nonce %s was sent %d times", nonce, n)
		}
	}
	counts["discord messages sent"] = len(fake.Sent())
	counts["local sends"] = len(a.kinds(store.LaneSpeech, "local.sent"))
	counts["context compactions"] = len(a.kinds(store.LaneNotice, "context.compacted"))
	counts["context budget pauses"] = len(a.kinds(store.LaneNotice, "context.budget"))
	counts["model requests"] = mix.requests()
	if s := a.session(); s.State == store.StatePaused || s.State == store.StateStopped {
		if s.StateReason == "" {
			violate("the session is %s without a reason", s.State)
		}
	}
	if settled {
		if g := finalSample.goroutines; g > early.goroutines+50 {
			violate("goroutines grew from %.0f to %.0f", early.goroutines, g)
		}
		if f := finalSample.fds; f > early.fds+20 {
			violate("file descriptors grew from %.0f to %.0f", early.fds, f)
		}
		if r := finalSample.rss; r > early.rss*1.5+32<<20 {
			violate("RSS grew from %.1f MB to %.1f MB", early.rss/(1<<20), r/(1<<20))
		}
	}
	// The daemon drains and leaves nothing behind.
	a.d.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.d.wait(t); err != nil {
		violate("klbr-core did not drain cleanly: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if s := strays(workspace, 0); len(s) > 0 {
		violate("%d processes outlived klbr-core: %v", len(s), s)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "soak %s (seed %d): %d violations\n", dur, seed, len(violations))
	for _, k := range sortedKeys(counts) {
		fmt.Fprintf(&b, "  %-28s %d\n", k, counts[k])
	}
	for _, k := range sortedKeys(sm.replies) {
		fmt.Fprintf(&b, "  model reply %-16s %d\n", k, sm.replies[k])
	}
	fmt.Fprintf(&b, "  first incarnation at start: %.0f goroutines, %.0f fds, %.1f MB RSS\n", start.goroutines, start.fds, start.rss/(1<<20))
	if settled {
		fmt.Fprintf(&b, "  last incarnation: %.0f goroutines, %.0f fds, %.1f MB RSS at its start; %.0f, %.0f, %.1f MB at the end\n",
			early.goroutines, early.fds, early.rss/(1<<20), finalSample.goroutines, finalSample.fds, finalSample.rss/(1<<20))
		fmt.Fprintf(&b, "  last incarnation's slopes over %d samples: RSS %+.2f MB/h, open files %+.1f/h\n",
			len(settledAt), slope(settledAt, settledRSS), slope(settledAt, settledFDs))
	}
	fmt.Fprintf(&b, "  largest WAL sampled: %.2f MB; at the end %.2f MB\n", float64(maxWAL)/(1<<20), float64(walBytes(a.data))/(1<<20))
	fmt.Fprintf(&b, "  worker host: %v\n", mix.host != nil)
	t.Log(b.String())
	if len(violations) > 0 {
		sessions, resumes := fake.Counts()
		t.Logf("klbr-discord's log is in %s; the gateway had %d sessions and %d resumes", dlogPath, sessions, resumes)
		t.Fatalf("%d violations:\n%s\ndaemon log (last incarnation):\n%s", len(violations), strings.Join(violations, "\n"), a.d)
	}
}

// disposition checks that every input the core acknowledged has one: in a
// frame (consumed), still pending, or decided (cancelled); none is left
// claimed by a frame that never committed.
func disposition(t *testing.T, db *sql.DB, acked []int64, violate func(string, ...any), counts map[string]int) {
	t.Helper()
	rows, err := db.Query(`SELECT i.id, i.source_kind, COALESCE(b.state, ''), b.frame_id IS NOT NULL FROM inputs i LEFT JOIN inbox b ON b.input_id = i.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	have := map[int64]bool{}
	for rows.Next() {
		var id int64
		var kind, state string
		var framed bool
		if err := rows.Scan(&id, &kind, &state, &framed); err != nil {
			t.Fatal(err)
		}
		have[id] = true
		counts["admitted "+kind]++
		counts["inbox "+state]++
		switch {
		case state == "consumed" && framed, state == "pending", state == "cancelled":
		default:
			violate("input %d (%s) has no disposition: inbox state %q, framed %v", id, kind, state, framed)
		}
	}
	for _, id := range acked {
		if !have[id] {
			violate("acknowledged operator input %d is not in the store", id)
		}
	}
}

// discordAdmitted waits up to limit for every message of expect to be
// admitted, then names those that are not (lost) and every message
// admitted more than once (duplicated).
func discordAdmitted(db *sql.DB, expect map[string]string, limit time.Duration) (lost, dup []string) {
	missing := func() []string {
		var out []string
		for id := range expect {
			var n int
			db.QueryRow(`SELECT count(*) FROM discord_messages WHERE message_id = ?`, id).Scan(&n)
			if n == 0 {
				out = append(out, id)
			}
		}
		return out
	}
	until(limit, func() bool { return len(missing()) == 0 })
	lost = missing()
	rows, err := db.Query(`SELECT message_id FROM discord_messages GROUP BY message_id HAVING count(*) > 1`)
	if err != nil {
		return lost, []string{"(query: " + err.Error() + ")"}
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		rows.Scan(&id)
		dup = append(dup, id)
	}
	return lost, dup
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// The soak's stray check finds a process with the workspace in its
// environment that is not under the daemon, and not one that is.
func TestStraysFindsOrphans(t *testing.T) {
	ws := t.TempDir()
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), "KLBR_WORKSPACE="+ws)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if s := strays(ws, 0); len(s) != 1 || !strings.Contains(s[0], "sleep 30") {
		t.Fatalf("strays with no daemon: %v", s)
	}
	if s := strays(ws, os.Getpid()); len(s) != 0 {
		t.Fatalf("a child of the live process counted as a stray: %v", s)
	}
}
