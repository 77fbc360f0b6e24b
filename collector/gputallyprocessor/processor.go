// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// bridge is one processor instance (one per pipeline that lists the processor) and the calls
// it makes, on the connection its processor ID shares with its other pipelines.
type bridge struct {
	cfg      *Config
	set      processor.Settings
	tel      *telemetry
	conns    *connections
	callOpts []grpc.CallOption

	// Set by start, before any batch arrives, to the ID's shared connections; cleared by
	// shutdown (nil: not started, or shut down). Atomic: batches in flight read it while
	// shutdown clears it, on other goroutines.
	client atomic.Pointer[pool]
}

func newBridge(set processor.Settings, cfg *Config, conns *connections) (*bridge, error) {
	tel, err := newTelemetry(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	return &bridge{
		cfg:   cfg,
		set:   set,
		tel:   tel,
		conns: conns,
		callOpts: []grpc.CallOption{
			grpc.MaxCallRecvMsgSize(cfg.maxMessageBytes()),
			grpc.MaxCallSendMsgSize(cfg.maxMessageBytes()),
		},
	}, nil
}

// start takes the processor ID's connections, creating them if this is the first of its
// pipelines to start. gRPC connects in the background, so start returns at once and a server
// that is not up yet is a failed call later, not a failed start.
func (b *bridge) start(ctx context.Context, host component.Host) error {
	p, err := b.conns.acquire(ctx, b.cfg, host, b.set.TelemetrySettings)
	if err != nil {
		return fmt.Errorf("gputally processor: connecting to %q: %w", b.cfg.ClientConfig.Endpoint, err)
	}
	b.client.Store(p)
	return nil
}

// shutdown lets go of the connection, which closes with its last pipeline; it is a no-op
// before start and when called again. A call made after it fails (the connection is closing,
// or the instance has none) and goes through on_error.
func (b *bridge) shutdown(context.Context) error {
	if b.client.Swap(nil) == nil {
		return nil // not started, or shut down already (a second shutdown releases nothing)
	}
	return b.conns.release(b.cfg)
}

// answer is what the three generated response types have in common.
type answer interface {
	GetOtlp() []byte
	GetDroppedItems() int64
	GetErrorMessage() string
	GetPatch() *bridgepb.Patch
}

// codec is what differs between signals: the OTLP encoding and the method called.
type codec[T any] struct {
	signal    attribute.KeyValue
	method    string
	marshal   func(T) ([]byte, error)
	unmarshal func([]byte) (T, error)
	items     func(T) int // data points, log records or spans
	resources func(T) int
	patch     func(data T, p *bridgepb.Patch, items int) error // applies a patch answer in place, or changes nothing
	call      func(ctx context.Context, c bridgepb.BridgeClient, otlp []byte, pipeline string, acceptPatch bool, opts ...grpc.CallOption) (answer, error)
}

var metricsCodec = codec[pmetric.Metrics]{
	signal: attribute.String("signal", "metrics"),
	method: "ProcessMetrics",
	marshal: func(md pmetric.Metrics) ([]byte, error) {
		return pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	},
	unmarshal: func(buf []byte) (pmetric.Metrics, error) {
		req := pmetricotlp.NewExportRequest()
		return req.Metrics(), req.UnmarshalProto(buf)
	},
	items:     pmetric.Metrics.DataPointCount,
	resources: func(md pmetric.Metrics) int { return md.ResourceMetrics().Len() },
	patch:     patchMetrics,
	call: func(ctx context.Context, c bridgepb.BridgeClient, otlp []byte, pipeline string, acceptPatch bool, opts ...grpc.CallOption) (answer, error) {
		return c.ProcessMetrics(ctx, &bridgepb.ProcessMetricsRequest{Otlp: otlp, Pipeline: pipeline, AcceptPatch: acceptPatch}, opts...)
	},
}

var logsCodec = codec[plog.Logs]{
	signal: attribute.String("signal", "logs"),
	method: "ProcessLogs",
	marshal: func(ld plog.Logs) ([]byte, error) {
		return plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	},
	unmarshal: func(buf []byte) (plog.Logs, error) {
		req := plogotlp.NewExportRequest()
		return req.Logs(), req.UnmarshalProto(buf)
	},
	items:     plog.Logs.LogRecordCount,
	resources: func(ld plog.Logs) int { return ld.ResourceLogs().Len() },
	patch:     patchLogs,
	call: func(ctx context.Context, c bridgepb.BridgeClient, otlp []byte, pipeline string, acceptPatch bool, opts ...grpc.CallOption) (answer, error) {
		return c.ProcessLogs(ctx, &bridgepb.ProcessLogsRequest{Otlp: otlp, Pipeline: pipeline, AcceptPatch: acceptPatch}, opts...)
	},
}

var tracesCodec = codec[ptrace.Traces]{
	signal: attribute.String("signal", "traces"),
	method: "ProcessTraces",
	marshal: func(td ptrace.Traces) ([]byte, error) {
		return ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	},
	unmarshal: func(buf []byte) (ptrace.Traces, error) {
		req := ptraceotlp.NewExportRequest()
		return req.Traces(), req.UnmarshalProto(buf)
	},
	items:     ptrace.Traces.SpanCount,
	resources: func(td ptrace.Traces) int { return td.ResourceSpans().Len() },
	patch:     patchTraces,
	call: func(ctx context.Context, c bridgepb.BridgeClient, otlp []byte, pipeline string, acceptPatch bool, opts ...grpc.CallOption) (answer, error) {
		return c.ProcessTraces(ctx, &bridgepb.ProcessTracesRequest{Otlp: otlp, Pipeline: pipeline, AcceptPatch: acceptPatch}, opts...)
	},
}

func (b *bridge) processMetrics(ctx context.Context, md pmetric.Metrics) (pmetric.Metrics, error) {
	return process(ctx, b, &metricsCodec, md)
}

func (b *bridge) processLogs(ctx context.Context, ld plog.Logs) (plog.Logs, error) {
	return process(ctx, b, &logsCodec, ld)
}

func (b *bridge) processTraces(ctx context.Context, td ptrace.Traces) (ptrace.Traces, error) {
	return process(ctx, b, &tracesCodec, td)
}

// process runs one batch through gputally. An answer with nothing left stops the batch with
// ErrSkipProcessingData (processorhelper reports success upstream); a failed call goes to
// on_error.
func process[T any](ctx context.Context, b *bridge, c *codec[T], data T) (T, error) {
	start := time.Now()
	items := c.items(data) // before a patch answer changes data
	out, ans, err := exchange(ctx, b, c, data, items)
	elapsed := time.Since(start)
	if err != nil {
		b.tel.recordCall(ctx, c.signal, outcomeError, elapsed)
		return onError(ctx, b, c, data, items, err)
	}
	if c.resources(out) == 0 {
		b.tel.recordCall(ctx, c.signal, outcomeDroppedAll, elapsed)
		b.tel.recordDropped(ctx, c.signal, reasonPipeline, int64(items))
		return out, processorhelper.ErrSkipProcessingData
	}
	b.tel.recordCall(ctx, c.signal, outcomeOK, elapsed)
	if dropped := ans.GetDroppedItems(); dropped > 0 {
		b.tel.recordDropped(ctx, c.signal, reasonPipeline, dropped)
		b.set.Logger.Debug("gputally dropped part of a batch",
			zap.String("signal", c.signal.Value.AsString()), zap.Int64("items", dropped),
			zap.String("reason", ans.GetErrorMessage()))
	}
	return out, nil
}

// exchange encodes the batch, calls the bridge within the timeout and decodes the answer, or
// applies it to the batch when it is a patch. Every error it returns carries a gRPC status:
// local encoding failures are INTERNAL, a patch that does not fit the batch INVALID_ARGUMENT.
func exchange[T any](ctx context.Context, b *bridge, c *codec[T], data T, items int) (T, answer, error) {
	var none T
	client := b.client.Load() // read once: shutdown clears it
	if client == nil {
		return none, nil, status.Error(codes.Unavailable, "the processor is not started (or already shut down)")
	}
	payload, err := c.marshal(data)
	if err != nil {
		return none, nil, status.Errorf(codes.Internal, "encoding the batch: %v", err)
	}
	callCtx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	ans, err := c.call(callCtx, client.client(), payload, b.cfg.Pipeline, b.cfg.AcceptPatch, b.callOpts...)
	if err != nil {
		return none, nil, err
	}
	if patch := ans.GetPatch(); patch != nil {
		if !b.cfg.AcceptPatch {
			return none, nil, status.Error(codes.Internal, "the answer is a patch, which this processor did not ask for")
		}
		// In place: the batch the processor was given becomes the answer (checked whole first,
		// so a refused patch leaves it as it came, for on_error).
		if err := c.patch(data, patch, items); err != nil {
			return none, nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return data, ans, nil
	}
	out, err := c.unmarshal(ans.GetOtlp())
	if err != nil {
		return none, nil, status.Errorf(codes.Internal, "the answer is not OTLP: %v", err)
	}
	return out, ans, nil
}

// onError applies on_error to a batch whose call failed.
func onError[T any](ctx context.Context, b *bridge, c *codec[T], data T, items int, err error) (T, error) {
	st := status.Convert(err)
	b.tel.recordError(ctx, c.signal, st.Code())
	switch b.cfg.OnError {
	case OnErrorPass:
		b.tel.recordPassed(ctx, c.signal, items)
		return data, nil
	case OnErrorDrop:
		b.tel.recordDropped(ctx, c.signal, reasonOnError, int64(items))
		return data, processorhelper.ErrSkipProcessingData
	default:
		err = fmt.Errorf("gputally %s (pipeline %q): %w", c.method, b.cfg.Pipeline, err)
		if !retryable(st) {
			err = consumererror.NewPermanent(err)
		}
		return data, err
	}
}

// retryable says whether a failed call may succeed if the batch is sent again, by OTLP's
// rules (proto/bridge/README.md, "Status codes"): RESOURCE_EXHAUSTED only when the server
// says when to retry (gRPC's own message-size limit uses the code without RetryInfo).
func retryable(st *status.Status) bool {
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.OutOfRange, codes.Unavailable, codes.DataLoss:
		return true
	case codes.ResourceExhausted:
		for _, detail := range st.Details() {
			if _, ok := detail.(*errdetails.RetryInfo); ok {
				return true
			}
		}
	}
	return false
}
