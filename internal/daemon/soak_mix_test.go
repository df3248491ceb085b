package daemon

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// The soak's second mix (issue 32): remote jobs on a worker host, spend
// caps hit and raised, Discord attachments read by a cell, and reloads
// that move the agent between two routes. Each event checks its own
// outcome at once and reports a violation rather than stopping the soak.

// soakHostsFrom is the shortest soak that boots the worker host: the
// 3-minute soak of `make test` stays without it (booting a host takes
// seconds and its remote jobs a few more); KLBR_SOAK_HOSTS=1 forces it.
const soakHostsFrom = 10 * time.Minute

// soakUsage is the usage every scripted answer reports: priced at
// soakPrice it costs $0.002.
func soakUsage() map[string]any {
	return map[string]any{"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
}

const soakPrice = "price = { input = 1.0, output = 10.0 }\n"

// soakMix holds what the new events need between them.
type soakMix struct {
	t       *testing.T
	a       *agent
	sm      *soakModel
	fake    *discordtest.Fake
	models  map[string]*modeltest.Server // by route: main, spare
	route   string                       // the route klbr.toml names now
	host    *hosttest.Host               // nil: the host part is off
	agent   string                       // the [agent] keys beside route
	seq     int
	nudged  time.Time
	violate func(format string, args ...any)
	counts  map[string]int
}

// config is the whole klbr.toml of the soak with the agent on route.
func (x *soakMix) config(route string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[agent]\nroute = %q\nretry_backoff_ms = 50\n%s\n", route, x.agent)
	for _, name := range []string{"main", "spare"} {
		fmt.Fprintf(&b, "[routes.%s]\nurl = %q\nmodel = \"fake-%s\"\ntimeout_seconds = 30\n%s\n", name, x.models[name].URL(), name, soakPrice)
	}
	b.WriteString("[spend]\ndaily_usd = 1000\ntime_zone = \"UTC\"\n\n")
	if h := x.host; h != nil {
		fmt.Fprintf(&b, "[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n",
			h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	}
	return b.String()
}

// requests is the number of model requests both routes have had.
func (x *soakMix) requests() int { return x.models["main"].Count() + x.models["spare"].Count() }

// poke sends an operator input, so that a waiting session asks its route.
func (x *soakMix) poke(acked *[]int64, why string) {
	x.seq++
	res, err := x.a.c.Send(x.t.Context(), "default", api.SendRequest{Text: "soak " + why, SourceKey: fmt.Sprintf("soak-mix-%d", x.seq)})
	if err != nil {
		x.counts["operator send refused"]++
		return
	}
	*acked = append(*acked, res.ID)
}

// nudge pokes the session when its last attempt ended at a request the
// route refused (400): such an attempt is not retried, only a new input
// starts the next one (TestRejectedRequest).
func (x *soakMix) nudge(acked *[]int64) {
	s, err := x.a.c.Session(x.t.Context(), "default")
	if err == nil && s.State == store.StateReady && s.Retry != nil && strings.Contains(s.Retry.LastError, "HTTP 400") &&
		time.Since(x.nudged) > 2*time.Second {
		x.nudged = time.Now()
		x.counts["nudge after a 400"]++
		x.poke(acked, "after a refused request")
	}
}

// calm ends the 400s still due, so that the event's own request is not
// refused.
func (x *soakMix) calm() { x.sm.set(func(m *soakModel) { m.reject = 0 }) }

// until polls cond every 100 ms up to limit.
func until(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// held reports whether the default session waits at a spend cap.
func (x *soakMix) held() bool {
	s, err := x.a.c.Session(x.t.Context(), "default")
	return err == nil && s.Retry != nil && s.Retry.State == RetryWaitingSpend
}

// spendCap lowers the daily cap to what the day has spent, sees the
// session held at it (no request starts, an input is admitted), raises
// it, and sees the session ask its route again.
func (x *soakMix) spendCap(acked *[]int64) {
	x.counts["spend cap"]++
	x.calm()
	st, err := x.a.c.Status(x.t.Context())
	if err != nil || st.Spend == nil {
		x.violate("spend cap: status has no spend: %+v %v", st.Spend, err)
		return
	}
	if st.Spend.DayUSD <= 0 {
		x.counts["spend cap skipped: nothing spent yet"]++
		return
	}
	// Half of what the day has spent: reached whatever a request in
	// flight settles at.
	capUSD := st.Spend.DayUSD / 2
	if _, err := x.a.c.SetSpendCap(x.t.Context(), "daily", capUSD); err != nil {
		x.violate("spend cap: lowering the daily cap to %v: %v", capUSD, err)
		return
	}
	x.poke(acked, "input at the cap")
	if !until(60*time.Second, x.held) {
		s := x.a.session()
		x.violate("spend cap: the session is not held at a daily cap of $%.4f within 60 s: state %s, retry %+v", capUSD, s.State, s.Retry)
		if _, err := x.a.c.SetSpendCap(x.t.Context(), "daily", 1000); err != nil {
			x.violate("spend cap: raising the daily cap: %v", err)
		}
		return
	}
	// Held: an input is admitted and no request starts.
	n := x.requests()
	x.poke(acked, "another input at the cap")
	time.Sleep(time.Second)
	if m := x.requests(); m != n {
		x.violate("spend cap: %d model requests started while the session was held", m-n)
	}
	if st, err := x.a.c.Status(x.t.Context()); err != nil || st.Spend == nil || len(st.Spend.Held) == 0 {
		x.violate("spend cap: status does not list the held session: %+v %v", st.Spend, err)
	}
	x.counts["spend cap held"]++
	n = x.requests()
	if _, err := x.a.c.SetSpendCap(x.t.Context(), "daily", 1000); err != nil {
		x.violate("spend cap: raising the daily cap: %v", err)
		return
	}
	if !until(60*time.Second, func() bool { x.nudge(acked); return !x.held() && x.requests() > n }) {
		s := x.a.session()
		x.violate("spend cap: the session did not resume within 60 s of the raised cap: state %s, retry %+v", s.State, s.Retry)
		return
	}
	x.counts["spend cap resumed"]++
}

// reload moves the agent to the other route through klbr-core reload and
// sees the next request go there.
func (x *soakMix) reload(acked *[]int64) {
	x.counts["reload"]++
	x.calm()
	to := "spare"
	if x.route == "spare" {
		to = "main"
	}
	x.a.writeConfig(x.config(to))
	got, err := x.a.c.Reload(x.t.Context())
	if err != nil {
		x.violate("reload to route %s: %v", to, err)
		return
	}
	from := x.route
	x.route = to
	if !slices.ContainsFunc(got.Applied, func(s string) bool { return strings.Contains(s, from+" -> "+to) }) ||
		!strings.HasPrefix(got.Agent, "route "+to) {
		x.violate("reload to route %s: applied %q, agent %q", to, got.Applied, got.Agent)
		return
	}
	n := x.models[to].Count()
	x.poke(acked, "input after a reload")
	if !until(60*time.Second, func() bool { x.nudge(acked); return x.models[to].Count() > n }) {
		s := x.a.session()
		x.violate("reload: route %s had no request within 60 s of the reload: state %s, retry %+v", to, s.State, s.Retry)
		return
	}
	x.counts["reload to "+to]++
}

// attachment sends a DM with a text attachment, sees its bytes fetched into
// an artifact of their digest, and a cell read the same text.
func (x *soakMix) attachment(db *sql.DB, msgID int, dms map[string]string, acked *[]int64) {
	x.counts["attachment"]++
	x.calm()
	if !until(30*time.Second, x.fake.Connected) {
		x.violate("attachment: no gateway session within 30 s")
		return
	}
	id := fmt.Sprint(msgID)
	body := []byte(strings.Repeat(fmt.Sprintf("soak attachment %s line\n", id), 200))
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	name := "soak-" + id + ".txt"
	m := discordtest.Message(id, "43", "", "53", "soak: a file "+id)
	m["attachments"] = []any{x.fake.Attachment(id+"1", "43", id, name, "text/plain", body, time.Hour)}
	x.sm.set(func(m *soakModel) {
		m.sticky = fmt.Sprintf("import hashlib\nfound = None\nfor it in await discord.items():\n    for a in it.attachments:\n"+
			"        if a.filename == %q:\n            found = a\nif found is None:\n    print('soak-att %s missing')\n"+
			"    await runtime.wait(1, reason='attachment not admitted yet')\nelse:\n"+
			"    print('soak-att %s', hashlib.sha256(found.text.encode()).hexdigest())\n    await runtime.wait(None)", name, id, id)
	})
	defer x.sm.set(func(m *soakModel) { m.sticky = "" })
	if !x.fake.Dispatch("MESSAGE_CREATE", m) {
		x.violate("attachment: the gateway did not take message %s", id)
		return
	}
	dms[id] = "a DM with an attachment in channel 43 at " + time.Now().UTC().Format("15:04:05.000")
	var state, got string
	if !until(90*time.Second, func() bool {
		db.QueryRow(`SELECT f.state, COALESCE(f.sha256, '') FROM discord_attachment_fetches f JOIN discord_messages d ON d.input_id = f.input_id WHERE d.message_id = ?`, id).Scan(&state, &got)
		return state != ""
	}) {
		x.violate("attachment of message %s: no fetch outcome within 90 s", id)
		return
	}
	if state != "fetched" || got != digest {
		x.violate("attachment of message %s: fetch %s, digest %s, want fetched %s", id, state, got, digest)
		return
	}
	want := "soak-att " + id + " " + digest
	if !until(90*time.Second, func() bool {
		x.nudge(acked)
		var n int
		db.QueryRow(`SELECT count(*) FROM events WHERE kind = 'cell.finished' AND content LIKE ?`, "%"+want+"%").Scan(&n)
		return n > 0
	}) {
		s := x.a.session()
		x.violate("attachment of message %s: no cell read its text within 90 s: state %s (%s), retry %+v", id, s.State, s.StateReason, s.Retry)
		return
	}
	x.counts["attachment read by a cell"]++
}

// remoteJob has a cell run a job on the worker host and sees it succeed
// there once, with its output.
func (x *soakMix) remoteJob(db *sql.DB, acked *[]int64) {
	if x.host == nil {
		return
	}
	x.counts["remote job"]++
	x.calm()
	x.seq++
	mark := fmt.Sprintf("soak-remote-%d", x.seq)
	// Every answer starts the job until it is in the store: an answer to a
	// request that new input preempted is dropped with its request.
	x.sm.set(func(m *soakModel) {
		m.sticky = fmt.Sprintf("j = await jobs.run(['sh', '-c', 'echo %s; cat /proc/sys/kernel/hostname'], host='lab')\n"+
			"await runtime.wait(None, reason='remote job')", mark)
	})
	defer x.sm.set(func(m *soakModel) { m.sticky = "" })
	x.poke(acked, "run a job on lab")
	var state, out string
	var runs int
	if !until(2*time.Minute, func() bool {
		x.nudge(acked)
		db.QueryRow(`SELECT state, output_preview, runs FROM jobs WHERE host = 'lab' AND spec LIKE ? ORDER BY id LIMIT 1`, "%"+mark+"%").Scan(&state, &out, &runs)
		if state != "" {
			x.sm.set(func(m *soakModel) { m.sticky = "" })
		}
		return state == string(store.JobSucceeded) || state == string(store.JobFailed) || state == string(store.JobCancelled) || state == string(store.JobUnknown)
	}) {
		x.violate("remote job %s: not ended within 2 minutes (state %q)", mark, state)
		return
	}
	if want := mark + "\n" + x.host.Hostname; state != string(store.JobSucceeded) || strings.TrimSpace(out) != want || runs != 1 {
		x.violate("remote job %s: %s after %d runs with output %q, want succeeded once with %q", mark, state, runs, out, want)
		return
	}
	x.counts["remote job succeeded"]++
}

// walBytes is the size of the store's write-ahead log (0: none).
func walBytes(data string) int64 {
	fi, err := os.Stat(filepath.Join(data, store.FileName+"-wal"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// slope is the least-squares slope of ys over xs (0 with fewer than 2).
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// The slope of a line is its slope; of a flat series, 0.
func TestSlope(t *testing.T) {
	if s := slope([]float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}); math.Abs(s-2) > 1e-12 {
		t.Fatalf("slope of 2x+1: %v", s)
	}
	if s := slope([]float64{0, 1, 2}, []float64{4, 4, 4}); s != 0 {
		t.Fatalf("slope of a flat series: %v", s)
	}
}
