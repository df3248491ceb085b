package daemon

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/delivery"
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
	a := newBenchAgent(t)
	hk := hooks.New(hooks.Config{Store: a.st}) // no release: delivery.prepare is the host's default
	t.Cleanup(hk.Close)
	a.bench.SetOps("local.", delivery.NewLocal(a.st, hk))
	ctx := t.Context()
	l := turn.New(turn.Config{
		Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: &tracedModel{}, Route: "main", ModelName: "test-model",
		Prompt:  func(context.Context, string) (string, error) { return "You are a test.", nil },
		Budgets: turn.Budgets{MaxSteps: 10, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3, ContextTokens: 1 << 30},
		Tracer:  tracer,
	})
	defer l.Close()
	if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("main"); return err }); err != nil {
		t.Fatal(err)
	}
	l.Start("main", false)
	if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: "main", SourceKind: admission.SourceOperator,
		SourceKey: "k1", Conversation: "operator", Author: "operator", Body: "say " + secretText}); err != nil {
		t.Fatal(err)
	}
	a.waitState(t, "main", store.StateWaiting)
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
