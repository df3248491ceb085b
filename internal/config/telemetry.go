package config

import (
	"fmt"
	"net/url"
	"strings"
)

// Telemetry is the [telemetry] section: OpenTelemetry traces of every
// attempt, exported over OTLP/HTTP to otlp_endpoint (http://tempo:4318).
// Omitted, nothing is traced and no exporter runs. capture_content adds
// message text and cell code to the spans; off, they carry only counts,
// ids, names and outcomes. trace_url, when set, is where the browser links
// an attempt's trace: an http(s) URL in which {trace_id} stands for the id
// (Grafana's Explore or Tempo's UI); unset, the browser shows the id as
// text.
type Telemetry struct {
	OTLPEndpoint   string `toml:"otlp_endpoint"`
	CaptureContent bool   `toml:"capture_content"`
	TraceURL       string `toml:"trace_url"`
}

// TraceIDPlaceholder is what trace_url's {trace_id} is.
const TraceIDPlaceholder = "{trace_id}"

// maxEndpointBytes bounds otlp_endpoint.
const maxEndpointBytes = 2048

// Enabled reports whether traces are exported.
func (t Telemetry) Enabled() bool { return t.OTLPEndpoint != "" }

// telemetry checks [telemetry]: an endpoint is an http(s) URL with a host,
// without credentials, query or fragment (a secret belongs in no URL that
// status and logs may show).
func (v *validator) telemetry(t *Telemetry) {
	v.traceURL(t.TraceURL)
	e := t.OTLPEndpoint
	if e == "" {
		if v.index.has("telemetry.otlp_endpoint") {
			v.fail("telemetry.otlp_endpoint", "is empty: give the collector's OTLP/HTTP URL (http://tempo:4318), or leave it out for no traces", "telemetry")
		}
		if t.CaptureContent {
			v.fail("telemetry.capture_content", "is set without telemetry.otlp_endpoint: nothing would be traced", "telemetry")
		}
		return
	}
	u, err := url.Parse(e)
	switch {
	case len(e) > maxEndpointBytes:
		v.fail("telemetry.otlp_endpoint", fmt.Sprintf("is longer than %d bytes", maxEndpointBytes), "telemetry")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(e, " \t\r\n"):
		v.fail("telemetry.otlp_endpoint", fmt.Sprintf("%q is not an http(s) URL with a host, like http://tempo:4318", e), "telemetry")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		v.fail("telemetry.otlp_endpoint", "must not carry credentials, a query or a fragment: give scheme, host, port and path only", "telemetry")
	}
}

// traceURL checks trace_url: an http(s) URL with a host and exactly one
// {trace_id}, without credentials (the browser shows it to whoever holds
// the page).
func (v *validator) traceURL(s string) {
	if s == "" {
		if v.index.has("telemetry.trace_url") {
			v.fail("telemetry.trace_url", "is empty: give a URL with {trace_id} in it, or leave it out to show trace ids as text", "telemetry")
		}
		return
	}
	u, err := url.Parse(strings.Replace(s, TraceIDPlaceholder, "0", 1))
	switch {
	case len(s) > maxEndpointBytes:
		v.fail("telemetry.trace_url", fmt.Sprintf("is longer than %d bytes", maxEndpointBytes), "telemetry")
	case strings.Count(s, TraceIDPlaceholder) != 1:
		v.fail("telemetry.trace_url", "must contain {trace_id} once: it is replaced by the attempt's trace id", "telemetry")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(s, " \t\r\n"):
		v.fail("telemetry.trace_url", fmt.Sprintf("%q is not an http(s) URL with a host, like https://grafana.example/explore?left=...{trace_id}...", s), "telemetry")
	case u.User != nil:
		v.fail("telemetry.trace_url", "must not carry credentials: the browser shows it", "telemetry")
	}
}
