package daemon

import (
	"context"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/telemetry"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/version"
)

// startTracing starts the OTLP exporter when [telemetry] otlp_endpoint is
// set; otherwise it returns a nil Tracer and nothing runs.
func (d *daemon) startTracing(ctx context.Context, cfg *config.Config) (tracing.Tracer, error) {
	t := cfg.File.Telemetry
	if !t.Enabled() {
		return nil, nil
	}
	tr, err := telemetry.New(ctx, telemetry.Options{Endpoint: t.OTLPEndpoint, CaptureContent: t.CaptureContent,
		Service: "klbr-core", Version: version.Version})
	if err != nil {
		return nil, err
	}
	d.tracer = tr
	d.log.Info("traces exported", "otlp_endpoint", t.OTLPEndpoint, "capture_content", t.CaptureContent)
	return tr, nil
}
