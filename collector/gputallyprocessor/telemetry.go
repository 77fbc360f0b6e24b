// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
)

const scopeName = "github.com/gputally/gputally/collector/gputallyprocessor"

// Outcomes of a call, the `outcome` attribute of calls and call_duration.
const (
	outcomeOK         = "ok"          // answered; the (possibly smaller) batch goes on
	outcomeDroppedAll = "dropped_all" // answered with nothing left: the batch stops here
	outcomeError      = "error"       // failed; on_error decides
)

// Reasons items were dropped, the `reason` attribute of dropped_items.
const (
	reasonPipeline = "pipeline" // gputally's pipeline dropped them (dropped_items, or an empty answer)
	reasonOnError  = "on_error" // the call failed and on_error is drop
)

// telemetry is the processor's own metrics, recorded through the Collector's MeterProvider
// (its processorhelper already counts items in and out). Every instrument carries `signal`.
type telemetry struct {
	calls        metric.Int64Counter
	errors       metric.Int64Counter
	passedItems  metric.Int64Counter
	droppedItems metric.Int64Counter
	duration     metric.Float64Histogram
}

func newTelemetry(set component.TelemetrySettings) (*telemetry, error) {
	meter := set.MeterProvider.Meter(scopeName)
	var t telemetry
	var errs, err error
	t.calls, err = meter.Int64Counter("otelcol_processor_gputally_calls",
		metric.WithDescription("Calls to gputally's bridge, by signal and outcome (ok, dropped_all, error)."),
		metric.WithUnit("{calls}"))
	errs = errors.Join(errs, err)
	t.errors, err = meter.Int64Counter("otelcol_processor_gputally_errors",
		metric.WithDescription("Failed calls to gputally's bridge, by signal and gRPC code (grpc-go's name, e.g. Unavailable)."),
		metric.WithUnit("{calls}"))
	errs = errors.Join(errs, err)
	t.passedItems, err = meter.Int64Counter("otelcol_processor_gputally_passed_items",
		metric.WithDescription("Items sent on unprocessed after a failed call (on_error: pass)."),
		metric.WithUnit("{items}"))
	errs = errors.Join(errs, err)
	t.droppedItems, err = meter.Int64Counter("otelcol_processor_gputally_dropped_items",
		metric.WithDescription("Items dropped, by reason: pipeline (gputally dropped them) or on_error (the call failed, on_error: drop)."),
		metric.WithUnit("{items}"))
	errs = errors.Join(errs, err)
	t.duration, err = meter.Float64Histogram("otelcol_processor_gputally_call_duration",
		metric.WithDescription("Duration of calls to gputally's bridge, by signal and outcome."),
		metric.WithUnit("ms"),
		metric.WithExplicitBucketBoundaries(0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
	errs = errors.Join(errs, err)
	return &t, errs
}

func (t *telemetry) recordCall(ctx context.Context, signal attribute.KeyValue, outcome string, elapsed time.Duration) {
	attrs := metric.WithAttributes(signal, attribute.String("outcome", outcome))
	t.calls.Add(ctx, 1, attrs)
	t.duration.Record(ctx, float64(elapsed)/float64(time.Millisecond), attrs)
}

func (t *telemetry) recordError(ctx context.Context, signal attribute.KeyValue, code codes.Code) {
	t.errors.Add(ctx, 1, metric.WithAttributes(signal, attribute.String("code", code.String())))
}

func (t *telemetry) recordPassed(ctx context.Context, signal attribute.KeyValue, items int) {
	t.passedItems.Add(ctx, int64(items), metric.WithAttributes(signal))
}

func (t *telemetry) recordDropped(ctx context.Context, signal attribute.KeyValue, reason string, items int64) {
	if items > 0 {
		t.droppedItems.Add(ctx, items, metric.WithAttributes(signal, attribute.String("reason", reason)))
	}
}
