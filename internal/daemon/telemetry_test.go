package daemon

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/delivery"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/telemetry"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/turn"
)

// otlpReceiver is an OTLP/HTTP collector: it decodes each export request's
// protobuf and keeps the spans.
type otlpReceiver struct {
	srv      *httptest.Server
	requests atomic.Int64
	mu       sync.Mutex // guards spans
	spans    []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.requests.Add(1)
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
			return
		}
		var body io.Reader = http.MaxBytesReader(w, r.Body, 16<<20)
		if r.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = z
		}
		data, err := io.ReadAll(body)
		var req collector.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *otlpReceiver) got() []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*tracepb.Span(nil), rc.spans...)
}

func attrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		v := kv.Value
		switch {
		case v.GetStringValue() != "":
			m[kv.Key] = v.GetStringValue()
		case v.GetArrayValue() != nil:
			var parts []string
			for _, e := range v.GetArrayValue().Values {
				parts = append(parts, e.GetStringValue())
			}
			m[kv.Key] = strings.Join(parts, ",")
		case v.GetDoubleValue() != 0:
			m[kv.Key] = fmt.Sprint(v.GetDoubleValue())
		default:
			m[kv.Key] = fmt.Sprint(v.GetIntValue())
		}
	}
	return m
}

// secretText is in the operator's input, the model's text and the cells'
// code: it must reach no span unless capture_content is on.
const secretText = "zebra-7341-secret"

// tracedModel answers: a cell that sends, a cell that computes, then a wait.
type tracedModel struct{ n atomic.Int64 }

func (m *tracedModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	n := m.n.Add(1)
	code := map[int64]string{1: "await local.send('" + secretText + "')", 2: "x = '" + secretText + "'"}[n]
	if code == "" {
		code = "await runtime.wait(None, reason='done')"
	}
	in, out, cached, cost := 120, 30, 100, 0.25
	return &provider.Response{Content: "thinking about " + secretText, FinishReason: "tool_calls",
		Usage:   provider.Usage{PromptTokens: &in, CompletionTokens: &out, CacheReadTokens: &cached},
		CostUSD: &cost, CostSource: "reported",
		ToolCalls: []provider.ToolCall{{ID: fmt.Sprintf("call_%d", n), Type: "function",
			Function: provider.FunctionCall{Name: "python", Arguments: fmt.Sprintf(`{"code": %q}`, code)}}}}, nil
}

// runTraced runs one attempt (three model requests, three cells, one
// send) under tracer (nil: off) and returns the attempt's record.
func runTraced(t *testing.T, tracer tracing.Tracer) store.AttemptInfo {
	att := runTracedWith(t, tracedRun{tracer: tracer, model: &tracedModel{}, after: func(a *benchAgent, _ *turn.Loop) {
		// Each step's scratchpad record names the attempt's trace (none
		// when tracing is off): tail and the browser show it.
		recs, err := a.st.Records(t.Context(), "main", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		steps := 0
		for _, r := range recs {
			if r.Kind != "scratchpad" {
				continue
			}
			steps++
			var c struct {
				TraceID *string `json:"trace_id"`
			}
			json.Unmarshal(r.Content, &c)
			if (tracer == nil) != (c.TraceID == nil) || (c.TraceID != nil && len(*c.TraceID) != 32) {
				t.Errorf("scratchpad record %d: trace_id %v with tracer %v", r.Seq, c.TraceID, tracer != nil)
			}
		}
		if steps != 3 {
			t.Errorf("%d scratchpad records, want 3", steps)
		}
	}})
	return att
}

// tracedRun is one traced attempt of session main.
type tracedRun struct {
	tracer tracing.Tracer
	model  turn.Model
	// bound boots main on the shipped behavior release: every hook slot
	// is bound, delivery.review reviews the send.
	bound bool
	// budget is the context budget in tokens (0: unbounded); compactor
	// compacts past it.
	budget    int
	compactor bool
	// agents serves agents.* (a spawned child runs on the same loop).
	agents bool
	// after runs once the attempt waits, before the loop closes.
	after func(a *benchAgent, l *turn.Loop)
}

func runTracedWith(t *testing.T, o tracedRun) store.AttemptInfo {
	a := newBenchAgent(t)
	ctx := t.Context()
	var hk *hooks.Dispatcher
	release := ""
	if o.bound {
		rel, err := behavior.Open(filepath.Join(t.TempDir(), "releases"))
		if err != nil {
			t.Fatal(err)
		}
		wb := a.bench.Config()
		hk = hooks.New(hooks.Config{Store: a.st, Releases: rel, Kernel: wb.Kernel, Python: wb.Python, RuntimeSrc: wb.RuntimeSrc,
			Workspace: wb.Workspace, Placer: wb.Placer, Limits: wb.Limits, Sandbox: wb.Sandbox})
		pub, err := rel.Publish(behaviortree.Tree())
		if err != nil {
			t.Fatal(err)
		}
		release = pub.ID
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("main"); return err }); err != nil {
			t.Fatal(err)
		}
		if _, err := activation.New(a.st, rel, hk, nil, nil).Boot(ctx, "main", release); err != nil {
			t.Fatal(err)
		}
	} else {
		hk = hooks.New(hooks.Config{Store: a.st}) // no release: delivery.prepare is the host's default
	}
	t.Cleanup(hk.Close)
	a.bench.SetOps("local.", delivery.NewLocal(a.st, hk))
	budget := o.budget
	if budget == 0 {
		budget = 1 << 30
	}
	cfg := turn.Config{
		Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: o.model, Route: "main", ModelName: "test-model",
		Prompt:  func(context.Context, string) (string, error) { return "You are a test.", nil },
		Budgets: turn.Budgets{MaxSteps: 100, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3, ContextTokens: budget},
		Tracer:  o.tracer,
	}
	if o.bound {
		cfg.Planner, cfg.Policy = hk, hk
	}
	if o.compactor {
		cfg.Compactor = history.New(history.Config{Store: a.st, Model: o.model, Route: "main", ModelName: "test-model"})
	}
	l := turn.New(cfg)
	defer l.Close()
	if o.agents {
		ag := agents.New(agents.Config{Store: a.st, Clock: time.Now, Start: func(s string) { l.Start(s, false) },
			Limits: store.ChildLimits{MaxDepth: 2, MaxDescendants: 4, MaxConcurrent: 4, MaxTreeTokens: 1 << 30, MaxSpawnsPerTree: 4, MaxSpawnsPerDay: 4}})
		a.bench.SetOps("agents.", ag)
	}
	if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("main"); return err }); err != nil {
		t.Fatal(err)
	}
	l.Start("main", false)
	if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: "main", SourceKind: admission.SourceOperator,
		SourceKey: "k1", Conversation: "operator", Author: "operator", Body: "say " + secretText}); err != nil {
		t.Fatal(err)
	}
	a.waitState(t, "main", store.StateWaiting)
	if o.after != nil {
		o.after(a, l)
	}
	ts, err := a.st.Turn(ctx, "main")
	if err != nil || ts.Attempt == nil {
		t.Fatalf("turn: %v %+v", err, ts)
	}
	return *ts.Attempt
}

func TestTracesOneTracePerAttempt(t *testing.T) {
	for _, capture := range []bool{false, true} {
		t.Run(fmt.Sprintf("capture_content=%v", capture), func(t *testing.T) {
			rc := newOTLPReceiver(t)
			tr, err := telemetry.New(t.Context(), telemetry.Options{Endpoint: rc.srv.URL, CaptureContent: capture, BatchTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			att := runTraced(t, tr)
			if err := tr.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := rc.got()
			if len(att.TraceID) != 32 {
				t.Fatalf("the attempt records trace id %q", att.TraceID)
			}
			byName := map[string][]*tracepb.Span{}
			var root *tracepb.Span
			for _, s := range spans {
				if id := fmt.Sprintf("%x", s.TraceId); id != att.TraceID {
					t.Errorf("span %s is in trace %s, not the attempt's %s", s.Name, id, att.TraceID)
				}
				byName[s.Name] = append(byName[s.Name], s)
				if s.Name == "klbr.attempt" {
					root = s
				}
			}
			if root == nil || len(root.ParentSpanId) != 0 || len(byName["klbr.attempt"]) != 1 {
				t.Fatalf("want one root klbr.attempt span; got %d spans: %v", len(spans), names(spans))
			}
			if got := attrs(root)["klbr.attempt"]; got != fmt.Sprint(att.ID) {
				t.Errorf("root klbr.attempt = %s, want %d", got, att.ID)
			}
			chats, cells, sends := byName["chat test-model"], byName["execute_tool python"], byName["klbr.host local.send"]
			if len(chats) != 3 || len(cells) != 3 || len(sends) != 1 {
				t.Fatalf("want 3 chat, 3 cell and 1 send span; got %v", names(spans))
			}
			for _, c := range chats {
				if string(c.ParentSpanId) != string(root.SpanId) {
					t.Errorf("chat span is not a child of the attempt")
				}
				want := map[string]string{"gen_ai.request.model": "test-model", "gen_ai.usage.input_tokens": "120",
					"gen_ai.usage.output_tokens": "30", "gen_ai.usage.cache_read.input_tokens": "100",
					"gen_ai.response.finish_reasons": "tool_calls", "klbr.route": "main", "klbr.cost_usd": "0.25"}
				got := attrs(c)
				for k, v := range want {
					if got[k] != v {
						t.Errorf("chat %s = %q, want %q", k, got[k], v)
					}
				}
			}
			for _, c := range cells {
				if string(c.ParentSpanId) != string(root.SpanId) {
					t.Errorf("cell span is not a child of the attempt")
				}
			}
			// The send is held here (no release reviews it); its receipt says so.
			if s := sends[0]; string(s.ParentSpanId) != string(cells[0].SpanId) || attrs(s)["klbr.receipt.status"] == "" {
				t.Errorf("the send's span is not the first cell's child with its receipt: %v", attrs(s))
			}
			var content bool
			for _, s := range spans {
				for _, v := range attrs(s) {
					content = content || strings.Contains(v, secretText)
				}
			}
			if content != capture {
				t.Errorf("message text or code in the spans: %v, want %v", content, capture)
			}
		})
	}
}

func names(spans []*tracepb.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// Without a tracer nothing is exported and the attempt records no trace.
func TestTracesOffSendsNothing(t *testing.T) {
	att := runTraced(t, nil)
	if att.TraceID != "" {
		t.Fatalf("trace id %q recorded with tracing off", att.TraceID)
	}
}

// receive starts an in-test collector and a tracer exporting to it.
func receive(t *testing.T, capture bool) (*otlpReceiver, *telemetry.Tracer) {
	rc := newOTLPReceiver(t)
	tr, err := telemetry.New(t.Context(), telemetry.Options{Endpoint: rc.srv.URL, CaptureContent: capture, BatchTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return rc, tr
}

// spanNamed returns the one span named name, failing otherwise.
func spanNamed(t *testing.T, spans []*tracepb.Span, name string) *tracepb.Span {
	t.Helper()
	var got []*tracepb.Span
	for _, s := range spans {
		if s.Name == name {
			got = append(got, s)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d spans named %s, want 1; got %v", len(got), name, names(spans))
	}
	return got[0]
}

// Each hook invocation is a span under its caller's: delivery.review under
// the send it reviews, the step's slots under the attempt; with its slot,
// outcome, latency and release, and without the input it saw.
func TestTracesHookSpans(t *testing.T) {
	rc, tr := receive(t, false)
	att := runTracedWith(t, tracedRun{tracer: tr, model: &tracedModel{}, bound: true})
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rc.got()
	send := spanNamed(t, spans, "klbr.host local.send")
	review := spanNamed(t, spans, "klbr.hook delivery.review")
	if string(review.ParentSpanId) != string(send.SpanId) {
		t.Errorf("delivery.review's span is not the send's child")
	}
	got := attrs(review)
	if got["klbr.hook.slot"] != "delivery.review" || got["klbr.hook.outcome"] != "ok" || got["klbr.release"] != att.Release ||
		got["klbr.hook.latency_ms"] == "" || att.Release == "" {
		t.Errorf("delivery.review's attributes: %v (the attempt's release %q)", got, att.Release)
	}
	var root *tracepb.Span
	hookSpans := 0
	for _, s := range spans {
		if s.Name == "klbr.attempt" {
			root = s
		}
		if strings.HasPrefix(s.Name, "klbr.hook ") {
			hookSpans++
			if id := fmt.Sprintf("%x", s.TraceId); id != att.TraceID {
				t.Errorf("hook span %s is in trace %s, not the attempt's %s", s.Name, id, att.TraceID)
			}
		}
		for _, v := range attrs(s) {
			if strings.Contains(v, secretText) {
				t.Errorf("span %s carries message text without capture_content", s.Name)
			}
		}
	}
	if root == nil || hookSpans < 4 {
		t.Fatalf("want the attempt and its hook spans; got %v", names(spans))
	}
}

// childModel answers main with a cell that spawns a child, then a wait; a
// child waits at once.
type childModel struct{ n atomic.Int64 }

func (m *childModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	code := "await runtime.wait(None, reason='done')"
	if !strings.HasPrefix(req.Meta.Session, "child-") && m.n.Add(1) == 1 {
		code = "child = await agents.spawn(task='count the widgets')"
	}
	return &provider.Response{FinishReason: "tool_calls", ToolCalls: []provider.ToolCall{{ID: "c1", Type: "function",
		Function: provider.FunctionCall{Name: "python", Arguments: fmt.Sprintf(`{"code": %q}`, code)}}}}, nil
}

// A child's attempts start traces of their own that link to the span of
// the parent's agents.spawn.
func TestTracesChildLinksToSpawn(t *testing.T) {
	rc, tr := receive(t, false)
	att := runTracedWith(t, tracedRun{tracer: tr, model: &childModel{}, agents: true, after: func(a *benchAgent, l *turn.Loop) {
		a.waitState(t, store.ChildSessionID(1), store.StateWaiting)
	}})
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rc.got()
	spawn := spanNamed(t, spans, "klbr.host agents.spawn")
	if fmt.Sprintf("%x", spawn.TraceId) != att.TraceID {
		t.Fatalf("the spawn is not in main's trace")
	}
	child := attrs(spawn)["klbr.child.session"]
	var childRoot *tracepb.Span
	for _, s := range spans {
		if s.Name == "klbr.attempt" && attrs(s)["klbr.session"] == child {
			childRoot = s
		}
	}
	if child == "" || childRoot == nil {
		t.Fatalf("no attempt span of the child %q; got %v", child, names(spans))
	}
	if string(childRoot.TraceId) == string(spawn.TraceId) || len(childRoot.ParentSpanId) != 0 {
		t.Errorf("the child's attempt is not a root of a trace of its own")
	}
	if len(childRoot.Links) != 1 || string(childRoot.Links[0].SpanId) != string(spawn.SpanId) ||
		string(childRoot.Links[0].TraceId) != string(spawn.TraceId) {
		t.Errorf("the child's trace does not link to the spawn's span: %v", childRoot.Links)
	}
}

// compactModel answers with cells that print a lot until the context passes
// its budget (the turn loop compacts), then waits; a request without tools
// is the summarizer's.
type compactModel struct{ n atomic.Int64 }

func (m *compactModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	if len(req.Tools) == 0 {
		return &provider.Response{Content: "Summary: the agent printed lines.", FinishReason: "stop"}, nil
	}
	n := m.n.Add(1)
	code := fmt.Sprintf("print('line %d', 'x' * 400)", n)
	if n > 30 {
		code = "await runtime.wait(None, reason='done')"
	}
	return &provider.Response{FinishReason: "tool_calls", ToolCalls: []provider.ToolCall{{ID: fmt.Sprintf("c%d", n), Type: "function",
		Function: provider.FunctionCall{Name: "python", Arguments: fmt.Sprintf(`{"code": %q}`, code)}}}}, nil
}

// A compaction the context's budget forces inside an attempt is a span of
// the attempt's trace with what it compacted.
func TestTracesCompaction(t *testing.T) {
	rc, tr := receive(t, false)
	att := runTracedWith(t, tracedRun{tracer: tr, model: &compactModel{}, budget: 4000, compactor: true})
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rc.got()
	var root *tracepb.Span
	var compactions []*tracepb.Span
	for _, s := range spans {
		switch s.Name {
		case "klbr.attempt":
			root = s
		case "klbr.compaction":
			compactions = append(compactions, s)
		}
	}
	if root == nil || len(compactions) == 0 {
		t.Fatalf("want the attempt and a compaction span; got %v", names(spans))
	}
	for _, c := range compactions {
		got := attrs(c)
		if string(c.ParentSpanId) != string(root.SpanId) || fmt.Sprintf("%x", c.TraceId) != att.TraceID {
			t.Errorf("the compaction is not the attempt's child")
		}
		if got["klbr.compaction.by"] != "threshold" || got["klbr.compaction.kind"] == "" || got["klbr.compaction.source_tokens"] == "0" {
			t.Errorf("compaction attributes: %v", got)
		}
	}
}

// An operator's compaction (klbr-core compact) runs outside any attempt: it
// is a trace of its own.
func TestTracesOperatorCompaction(t *testing.T) {
	rc, tr := receive(t, false)
	runTracedWith(t, tracedRun{tracer: tr, model: &compactModel{}, compactor: true, after: func(a *benchAgent, l *turn.Loop) {
		if _, err := l.Compact(t.Context(), "main"); err != nil {
			t.Fatalf("compact: %v", err)
		}
	}})
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := spanNamed(t, rc.got(), "klbr.compaction")
	if got := attrs(c); len(c.ParentSpanId) != 0 || got["klbr.compaction.by"] != "operator" || got["klbr.compaction.kind"] == "" {
		t.Errorf("the operator's compaction: parent %x, attributes %v", c.ParentSpanId, got)
	}
}
