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
// ids, names and outcomes.
type Telemetry struct {
	OTLPEndpoint   string `toml:"otlp_endpoint"`
	CaptureContent bool   `toml:"capture_content"`
}

// maxEndpointBytes bounds otlp_endpoint.
const maxEndpointBytes = 2048

// Enabled reports whether traces are exported.
func (t Telemetry) Enabled() bool { return t.OTLPEndpoint != "" }

// telemetry checks [telemetry]: an endpoint is an http(s) URL with a host,
// without credentials, query or fragment (a secret belongs in no URL that
// status and logs may show).
func (v *validator) telemetry(t *Telemetry) {
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
