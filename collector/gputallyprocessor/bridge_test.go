// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/collector/processor/processortest"
	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// The test stand-in for gputally's bridge server: a real gRPC server on a loopback port that
// answers every method through one handler, and a "pipe" that runs one signal's processor in
// front of a sink, so each behaviour is tested on all three signals the same way.

// reply is a handler's answer: the OTLP bytes to send back and the dropped-items report.
type reply struct {
	otlp         []byte
	droppedItems int64
	errorMessage string
	patch        *bridgepb.Patch // answered instead of otlp when set
}

// handler answers one call; signal is "metrics", "logs" or "traces".
type handler func(ctx context.Context, signal, pipeline string, otlp []byte) (reply, error)

type fakeBridge struct {
	bridgepb.UnimplementedBridgeServer
	handle handler

	mu        sync.Mutex
	pipelines []string
	patches   []bool // each call's accept_patch
}

func (f *fakeBridge) serve(ctx context.Context, signal, pipeline string, acceptPatch bool, otlp []byte) (reply, error) {
	f.mu.Lock()
	f.pipelines = append(f.pipelines, pipeline)
	f.patches = append(f.patches, acceptPatch)
	f.mu.Unlock()
	return f.handle(ctx, signal, pipeline, otlp)
}

func (f *fakeBridge) acceptPatch() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.patches...)
}

func (f *fakeBridge) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.pipelines...)
}

func (f *fakeBridge) ProcessMetrics(ctx context.Context, req *bridgepb.ProcessMetricsRequest) (*bridgepb.ProcessMetricsResponse, error) {
	r, err := f.serve(ctx, "metrics", req.GetPipeline(), req.GetAcceptPatch(), req.GetOtlp())
	if err != nil {
		return nil, err
	}
	return &bridgepb.ProcessMetricsResponse{Otlp: r.otlp, DroppedItems: r.droppedItems, ErrorMessage: r.errorMessage, Patch: r.patch}, nil
}

func (f *fakeBridge) ProcessLogs(ctx context.Context, req *bridgepb.ProcessLogsRequest) (*bridgepb.ProcessLogsResponse, error) {
	r, err := f.serve(ctx, "logs", req.GetPipeline(), req.GetAcceptPatch(), req.GetOtlp())
	if err != nil {
		return nil, err
	}
	return &bridgepb.ProcessLogsResponse{Otlp: r.otlp, DroppedItems: r.droppedItems, ErrorMessage: r.errorMessage, Patch: r.patch}, nil
}

func (f *fakeBridge) ProcessTraces(ctx context.Context, req *bridgepb.ProcessTracesRequest) (*bridgepb.ProcessTracesResponse, error) {
	r, err := f.serve(ctx, "traces", req.GetPipeline(), req.GetAcceptPatch(), req.GetOtlp())
	if err != nil {
		return nil, err
	}
	return &bridgepb.ProcessTracesResponse{Otlp: r.otlp, DroppedItems: r.droppedItems, ErrorMessage: r.errorMessage, Patch: r.patch}, nil
}

// bigMessages are the server limits the README asks a bridge server for (64 MiB).
var bigMessages = []grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 20), grpc.MaxSendMsgSize(64 << 20)}

// startBridge serves h on 127.0.0.1:0 until the test ends and returns the server and its address.
func startBridge(t *testing.T, h handler, opts ...grpc.ServerOption) (*fakeBridge, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	fake := &fakeBridge{handle: h}
	bridgepb.RegisterBridgeServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return fake, lis.Addr().String()
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

func testConfig(endpoint string) *Config {
	cfg := createDefaultConfig().(*Config)
	cfg.ClientConfig.Endpoint = endpoint
	cfg.ClientConfig.TLS.Insecure = true
	cfg.Pipeline = "bridge"
	return cfg
}

// The attribute the test bridge adds to every resource, as gputally's attribution would.
const podKey, podName = "k8s.pod.name", "trainer-0"

// labelPods is a handler that decodes the batch, labels every resource and sends it back.
func labelPods(_ context.Context, signal, _ string, otlp []byte) (reply, error) {
	return reply{otlp: editResources(signal, otlp, func(attrs pcommon.Map) bool {
		attrs.PutStr(podKey, podName)
		return true
	})}, nil
}

// editResources decodes an OTLP request of signal, calls keep on each resource's attributes
// (false removes the resource) and encodes the rest.
func editResources(signal string, otlp []byte, keep func(pcommon.Map) bool) []byte {
	var out []byte
	var err error
	switch signal {
	case "metrics":
		req := pmetricotlp.NewExportRequest()
		must(req.UnmarshalProto(otlp))
		req.Metrics().ResourceMetrics().RemoveIf(func(r pmetric.ResourceMetrics) bool { return !keep(r.Resource().Attributes()) })
		out, err = req.MarshalProto()
	case "logs":
		req := plogotlp.NewExportRequest()
		must(req.UnmarshalProto(otlp))
		req.Logs().ResourceLogs().RemoveIf(func(r plog.ResourceLogs) bool { return !keep(r.Resource().Attributes()) })
		out, err = req.MarshalProto()
	case "traces":
		req := ptraceotlp.NewExportRequest()
		must(req.UnmarshalProto(otlp))
		req.Traces().ResourceSpans().RemoveIf(func(r ptrace.ResourceSpans) bool { return !keep(r.Resource().Attributes()) })
		out, err = req.MarshalProto()
	}
	must(err)
	return out
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// pipe is one signal's processor, started, in front of a sink.
type pipe struct {
	proc component.Component
	// consume sends a batch of `resources` resources with one item each, resource i named "r<i>".
	consume func(ctx context.Context, resources int) error
	// delivered is the resource attributes of everything the sink received.
	delivered func() []pcommon.Map
	tel       *componenttest.Telemetry
}

var signals = []string{"metrics", "logs", "traces"}

func newPipe(t *testing.T, signal string, cfg *Config) *pipe {
	t.Helper()
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := processortest.NewNopSettings(componentType)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	ctx := context.Background()
	p := &pipe{tel: tel}
	switch signal {
	case "metrics":
		sink := new(consumertest.MetricsSink)
		proc, err := NewFactory().CreateMetrics(ctx, set, cfg, sink)
		require.NoError(t, err)
		p.proc = proc
		p.consume = func(ctx context.Context, n int) error { return proc.ConsumeMetrics(ctx, testMetrics(n)) }
		p.delivered = func() (out []pcommon.Map) {
			for _, md := range sink.AllMetrics() {
				for _, rm := range md.ResourceMetrics().All() {
					out = append(out, rm.Resource().Attributes())
				}
			}
			return out
		}
	case "logs":
		sink := new(consumertest.LogsSink)
		proc, err := NewFactory().CreateLogs(ctx, set, cfg, sink)
		require.NoError(t, err)
		p.proc = proc
		p.consume = func(ctx context.Context, n int) error { return proc.ConsumeLogs(ctx, testLogs(n, "")) }
		p.delivered = func() (out []pcommon.Map) {
			for _, ld := range sink.AllLogs() {
				for _, rl := range ld.ResourceLogs().All() {
					out = append(out, rl.Resource().Attributes())
				}
			}
			return out
		}
	case "traces":
		sink := new(consumertest.TracesSink)
		proc, err := NewFactory().CreateTraces(ctx, set, cfg, sink)
		require.NoError(t, err)
		p.proc = proc
		p.consume = func(ctx context.Context, n int) error { return proc.ConsumeTraces(ctx, testTraces(n)) }
		p.delivered = func() (out []pcommon.Map) {
			for _, td := range sink.AllTraces() {
				for _, rs := range td.ResourceSpans().All() {
					out = append(out, rs.Resource().Attributes())
				}
			}
			return out
		}
	default:
		t.Fatalf("no signal %q", signal)
	}
	require.NoError(t, p.proc.Start(ctx, componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, p.proc.Shutdown(context.Background())) })
	return p
}

func testMetrics(resources int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	for i := range resources {
		rm := md.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("name", fmt.Sprintf("r%d", i))
		g := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		g.SetName("gpu.utilization")
		g.SetEmptyGauge().DataPoints().AppendEmpty().SetDoubleValue(0.5)
	}
	return md
}

// testLogs makes one record per resource; body, if given, is the first record's body.
func testLogs(resources int, body string) plog.Logs {
	ld := plog.NewLogs()
	for i := range resources {
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("name", fmt.Sprintf("r%d", i))
		rec := rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
		rec.Body().SetStr("job started")
		if i == 0 && body != "" {
			rec.Body().SetStr(body)
		}
	}
	return ld
}

func testTraces(resources int) ptrace.Traces {
	td := ptrace.NewTraces()
	for i := range resources {
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("name", fmt.Sprintf("r%d", i))
		rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("step")
	}
	return td
}

// sum is the total of a counter's points whose attributes include every key/value of want.
func (p *pipe) sum(t *testing.T, name string, want map[string]string) int64 {
	t.Helper()
	m, err := p.tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		matched := true
		for k, v := range want {
			got, ok := dp.Attributes.Value(otelattr.Key(k))
			matched = matched && ok && got.String() == v
		}
		if matched {
			total += dp.Value
		}
	}
	return total
}
