package config

import (
	"strings"
	"testing"
)

func TestParseTelemetry(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    Telemetry
		wantErr string // the key and message, "" when accepted
		line    int
	}{
		{name: "omitted: off", doc: "", want: Telemetry{}},
		{name: "endpoint", doc: "[telemetry]\notlp_endpoint = \"http://tempo:4318\"\n", want: Telemetry{OTLPEndpoint: "http://tempo:4318"}},
		{name: "endpoint with path and content", doc: "[telemetry]\notlp_endpoint = \"https://otel.example/v1/traces\"\ncapture_content = true\n",
			want: Telemetry{OTLPEndpoint: "https://otel.example/v1/traces", CaptureContent: true}},
		{name: "empty endpoint", doc: "[telemetry]\notlp_endpoint = \"\"\n", wantErr: "telemetry.otlp_endpoint: is empty", line: 2},
		{name: "grpc scheme", doc: "[telemetry]\notlp_endpoint = \"grpc://tempo:4317\"\n", wantErr: "is not an http(s) URL", line: 2},
		{name: "no host", doc: "[telemetry]\notlp_endpoint = \"http:///v1/traces\"\n", wantErr: "is not an http(s) URL", line: 2},
		{name: "bare host", doc: "[telemetry]\notlp_endpoint = \"tempo:4318\"\n", wantErr: "is not an http(s) URL", line: 2},
		{name: "credentials", doc: "[telemetry]\notlp_endpoint = \"http://user:secret@tempo:4318\"\n", wantErr: "must not carry credentials", line: 2},
		{name: "query", doc: "[telemetry]\notlp_endpoint = \"http://tempo:4318/?token=x\"\n", wantErr: "must not carry credentials", line: 2},
		{name: "content without endpoint", doc: "[telemetry]\ncapture_content = true\n", wantErr: "telemetry.capture_content: is set without", line: 2},
		{name: "content as a string", doc: "[telemetry]\ncapture_content = \"yes\"\n", wantErr: "capture_content", line: 2},
		{name: "trace url", doc: "[telemetry]\ntrace_url = \"https://grafana.example/explore?left={\\\"queries\\\":[{\\\"query\\\":\\\"{trace_id}\\\"}]}\"\n",
			want: Telemetry{TraceURL: `https://grafana.example/explore?left={"queries":[{"query":"{trace_id}"}]}`}},
		{name: "trace url without the id", doc: "[telemetry]\ntrace_url = \"https://grafana.example/explore\"\n", wantErr: "must contain {trace_id} once", line: 2},
		{name: "trace url twice", doc: "[telemetry]\ntrace_url = \"https://t.example/{trace_id}/{trace_id}\"\n", wantErr: "must contain {trace_id} once", line: 2},
		{name: "trace url javascript", doc: "[telemetry]\ntrace_url = \"javascript:alert('{trace_id}')\"\n", wantErr: "is not an http(s) URL", line: 2},
		{name: "trace url credentials", doc: "[telemetry]\ntrace_url = \"https://u:p@t.example/{trace_id}\"\n", wantErr: "must not carry credentials", line: 2},
		{name: "unknown key", doc: "[telemetry]\nendpoint = \"http://x\"\n", wantErr: "telemetry.endpoint", line: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse("klbr.toml", []byte(tt.doc))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if f.Telemetry != tt.want {
					t.Fatalf("telemetry = %+v, want %+v", f.Telemetry, tt.want)
				}
				return
			}
			errs := Errors(err)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.wantErr) || errs[0].Line != tt.line {
				t.Fatalf("err = %v, want one at line %d with %q", err, tt.line, tt.wantErr)
			}
		})
	}
}
