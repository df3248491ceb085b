package metrics

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/store"
)

// Each host's up, units by kind (zero-valued) and waiting jobs are read at
// scrape time, and promtool accepts them.
func TestHostSeries(t *testing.T) {
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := New(st, time.Now, slog.New(slog.DiscardHandler))
	state := []HostState{{Name: "gpu", Up: true, Units: map[string]int{"job": 3}}, {Name: "old", Waiting: 2}}
	m.WatchHosts(func(context.Context) []HostState { return state })
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	scrape := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	text := scrape()
	for _, want := range []string{`klbr_host_up{host="gpu"} 1`, `klbr_host_up{host="old"} 0`,
		`klbr_host_units{host="gpu",kind="job"} 3`, `klbr_host_units{host="old",kind="job"} 0`,
		`klbr_host_jobs_waiting{host="gpu"} 0`, `klbr_host_jobs_waiting{host="old"} 2`} {
		if !strings.Contains(text, want) {
			t.Errorf("the exposition lacks %s", want)
		}
	}
	state = []HostState{{Name: "gpu"}}
	if text := scrape(); !strings.Contains(text, `klbr_host_up{host="gpu"} 0`) || strings.Contains(text, `host="old"`) {
		t.Errorf("a second scrape does not read the state again:\n%s", text)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		citest.SkipOrFail(t, "promtool not found (Debian: apt-get install -y prometheus)")
	}
	c := exec.Command(promtool, "check", "metrics")
	c.Stdin = bytes.NewReader([]byte(text))
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
