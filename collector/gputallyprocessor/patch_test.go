// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// patchBatch is two resources, each with two scopes of two metrics (a gauge and a histogram)
// of two points: 16 points, every level addressable.
func patchBatch() pmetric.Metrics {
	md := pmetric.NewMetrics()
	for r := range 2 {
		rm := md.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("name", "r"+string(rune('0'+r)))
		rm.Resource().Attributes().PutStr("keep", "yes")
		for s := range 2 {
			sm := rm.ScopeMetrics().AppendEmpty()
			sm.Scope().SetName("scope" + string(rune('0'+s)))
			gauge := sm.Metrics().AppendEmpty()
			gauge.SetName("gpu.utilization")
			gauge.SetEmptyGauge()
			hist := sm.Metrics().AppendEmpty()
			hist.SetName("gpu.latency")
			hist.SetEmptyHistogram()
			for p := range 2 {
				dp := gauge.Gauge().DataPoints().AppendEmpty()
				dp.SetDoubleValue(float64(p))
				dp.Attributes().PutInt("p", int64(p))
				hist.Histogram().DataPoints().AppendEmpty().Attributes().PutInt("p", int64(p))
			}
		}
	}
	return md
}

func str(v string) *bridgepb.AnyValue {
	return &bridgepb.AnyValue{Value: &bridgepb.AnyValue_StringValue{StringValue: v}}
}

func set(kvs ...*bridgepb.KeyValue) *bridgepb.Attributes { return &bridgepb.Attributes{Set: kvs} }

func kv(key string, v *bridgepb.AnyValue) *bridgepb.KeyValue {
	return &bridgepb.KeyValue{Key: key, Value: v}
}

// shaped is a patch for patchBatch's shape.
func shaped(resources ...*bridgepb.ResourcePatch) *bridgepb.Patch {
	return &bridgepb.Patch{ResourceCount: 2, ItemCount: 16, Resources: resources}
}

func TestPatchSetsEveryAttributeType(t *testing.T) {
	every := []*bridgepb.KeyValue{
		kv("s", str("trainer-0")),
		kv("b", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_BoolValue{BoolValue: true}}),
		kv("i", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_IntValue{IntValue: -7}}),
		kv("d", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_DoubleValue{DoubleValue: 0.25}}),
		kv("raw", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_BytesValue{BytesValue: []byte{0, 1, 255}}}),
		kv("arr", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_ArrayValue{ArrayValue: &bridgepb.ArrayValue{
			Values: []*bridgepb.AnyValue{str("a"), {Value: &bridgepb.AnyValue_IntValue{IntValue: 2}}, {}}}}}),
		kv("map", &bridgepb.AnyValue{Value: &bridgepb.AnyValue_KvlistValue{KvlistValue: &bridgepb.KeyValueList{
			Values: []*bridgepb.KeyValue{kv("inner", str("x")), kv("nested", &bridgepb.AnyValue{
				Value: &bridgepb.AnyValue_ArrayValue{ArrayValue: &bridgepb.ArrayValue{Values: []*bridgepb.AnyValue{str("y")}}}})}}}}),
		kv("empty", &bridgepb.AnyValue{}),
		kv("name", str("replaced")), // an existing key takes the new value
	}
	md := patchBatch()
	patch := shaped(&bridgepb.ResourcePatch{
		Index: 1, Attributes: set(every...),
		Scopes: []*bridgepb.ScopePatch{{
			Index: 0, Attributes: set(kv("scope.k", str("v"))),
			Metrics: []*bridgepb.MetricPatch{{Index: 1, Points: []*bridgepb.ItemPatch{{Index: 1, Attributes: set(every...)}}}},
		}},
	})

	require.NoError(t, patchMetrics(md, patch, md.DataPointCount()))

	want := pcommon.NewMap()
	want.PutStr("keep", "yes")
	want.PutStr("s", "trainer-0")
	want.PutBool("b", true)
	want.PutInt("i", -7)
	want.PutDouble("d", 0.25)
	want.PutEmptyBytes("raw").FromRaw([]byte{0, 1, 255})
	arr := want.PutEmptySlice("arr")
	arr.AppendEmpty().SetStr("a")
	arr.AppendEmpty().SetInt(2)
	arr.AppendEmpty()
	m := want.PutEmptyMap("map")
	m.PutStr("inner", "x")
	m.PutEmptySlice("nested").AppendEmpty().SetStr("y")
	want.PutEmpty("empty")
	want.PutStr("name", "replaced")
	rm := md.ResourceMetrics().At(1)
	assert.Equal(t, want.AsRaw(), rm.Resource().Attributes().AsRaw())
	assert.Equal(t, map[string]any{"scope.k": "v"}, rm.ScopeMetrics().At(0).Scope().Attributes().AsRaw())
	point := want.AsRaw()
	point["p"] = int64(1)
	delete(point, "keep")
	assert.Equal(t, point, rm.ScopeMetrics().At(0).Metrics().At(1).Histogram().DataPoints().At(1).Attributes().AsRaw())
	// What the patch did not address is as it was.
	untouched := patchBatch()
	assert.Equal(t, untouched.ResourceMetrics().At(0).Resource().Attributes().AsRaw(), md.ResourceMetrics().At(0).Resource().Attributes().AsRaw())
	assert.Equal(t, map[string]any{"p": int64(0)}, rm.ScopeMetrics().At(0).Metrics().At(1).Histogram().DataPoints().At(0).Attributes().AsRaw())
	assert.Equal(t, 16, md.DataPointCount())
}

func TestPatchRemovesAttributes(t *testing.T) {
	md := patchBatch()
	patch := shaped(&bridgepb.ResourcePatch{
		Index:      0,
		Attributes: &bridgepb.Attributes{Remove: []string{"keep", "absent"}, Set: []*bridgepb.KeyValue{kv("keep", str("again"))}},
		Scopes: []*bridgepb.ScopePatch{{Index: 1, Metrics: []*bridgepb.MetricPatch{{
			Index: 0, Points: []*bridgepb.ItemPatch{{Index: 0, Attributes: &bridgepb.Attributes{Remove: []string{"p"}}}},
		}}}},
	})

	require.NoError(t, patchMetrics(md, patch, md.DataPointCount()))

	// remove comes before set: a key removed and set again has the new value
	assert.Equal(t, map[string]any{"name": "r0", "keep": "again"}, md.ResourceMetrics().At(0).Resource().Attributes().AsRaw())
	assert.Equal(t, 0, md.ResourceMetrics().At(0).ScopeMetrics().At(1).Metrics().At(0).Gauge().DataPoints().At(0).Attributes().Len())
}

func TestPatchDropsByPositionAsSent(t *testing.T) {
	md := patchBatch()
	patch := shaped(
		&bridgepb.ResourcePatch{Index: 0, Scopes: []*bridgepb.ScopePatch{
			{Index: 0, Drop: true},
			{Index: 1, Metrics: []*bridgepb.MetricPatch{
				{Index: 0, Drop: true},
				{Index: 1, Points: []*bridgepb.ItemPatch{{Index: 0, Drop: true}, {Index: 1, Attributes: set(kv("kept", str("1")))}}},
			}},
		}},
		&bridgepb.ResourcePatch{Index: 1, Drop: true, Attributes: set(kv("ignored", str("x")))},
	)

	require.NoError(t, patchMetrics(md, patch, md.DataPointCount()))

	require.Equal(t, 1, md.ResourceMetrics().Len())
	sms := md.ResourceMetrics().At(0).ScopeMetrics()
	require.Equal(t, 1, sms.Len())
	assert.Equal(t, "scope1", sms.At(0).Scope().Name())
	require.Equal(t, 1, sms.At(0).Metrics().Len())
	points := sms.At(0).Metrics().At(0).Histogram().DataPoints()
	require.Equal(t, 1, points.Len())
	assert.Equal(t, map[string]any{"p": int64(1), "kept": "1"}, points.At(0).Attributes().AsRaw())
}

func TestPatchDropsLogRecordsAndSpans(t *testing.T) {
	ld := testLogs(2, "")
	ld.ResourceLogs().At(1).ScopeLogs().At(0).LogRecords().AppendEmpty().Body().SetStr("second")
	require.NoError(t, patchLogsN(ld, &bridgepb.Patch{ResourceCount: 2, ItemCount: 3, Resources: []*bridgepb.ResourcePatch{
		{Index: 1, Scopes: []*bridgepb.ScopePatch{{Index: 0, Records: []*bridgepb.ItemPatch{
			{Index: 0, Drop: true}, {Index: 1, Attributes: set(kv("k8s.pod.name", str("p")))},
		}}}},
	}}))
	recs := ld.ResourceLogs().At(1).ScopeLogs().At(0).LogRecords()
	require.Equal(t, 1, recs.Len())
	assert.Equal(t, "second", recs.At(0).Body().Str())
	assert.Equal(t, map[string]any{"k8s.pod.name": "p"}, recs.At(0).Attributes().AsRaw())

	td := testTraces(2)
	require.NoError(t, patchTracesN(td, &bridgepb.Patch{ResourceCount: 2, ItemCount: 2, Resources: []*bridgepb.ResourcePatch{
		{Index: 0, Scopes: []*bridgepb.ScopePatch{{Index: 0, Records: []*bridgepb.ItemPatch{{Index: 0, Drop: true}}}}},
		{Index: 1, Attributes: set(kv("slurm.job.id", str("42")))},
	}}))
	assert.Equal(t, 0, td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().Len())
	assert.Equal(t, "42", func() string {
		v, _ := td.ResourceSpans().At(1).Resource().Attributes().Get("slurm.job.id")
		return v.Str()
	}())
}

func TestEmptyPatchChangesNothing(t *testing.T) {
	md := patchBatch()
	require.NoError(t, patchMetrics(md, shaped(), md.DataPointCount()))
	assert.Equal(t, patchBatch(), md)
}

// Every refused patch leaves the batch exactly as it was, though its first parts fit.
func TestPatchThatDoesNotFitIsRefusedWhole(t *testing.T) {
	fits := &bridgepb.ResourcePatch{Index: 0, Attributes: set(kv("k8s.pod.name", str("p"))),
		Scopes: []*bridgepb.ScopePatch{{Index: 0, Drop: true}}}
	cases := map[string]*bridgepb.Patch{
		"resource past the end": shaped(fits, &bridgepb.ResourcePatch{Index: 2}),
		"scope past the end":    shaped(fits, &bridgepb.ResourcePatch{Index: 1, Scopes: []*bridgepb.ScopePatch{{Index: 2}}}),
		"metric past the end": shaped(fits, &bridgepb.ResourcePatch{Index: 1, Scopes: []*bridgepb.ScopePatch{
			{Index: 0, Metrics: []*bridgepb.MetricPatch{{Index: 2, Drop: true}}}}}),
		"point past the end": shaped(fits, &bridgepb.ResourcePatch{Index: 1, Scopes: []*bridgepb.ScopePatch{
			{Index: 0, Metrics: []*bridgepb.MetricPatch{{Index: 0, Points: []*bridgepb.ItemPatch{{Index: 2}}}}}}}),
		"index twice":        shaped(fits, fits),
		"out of order":       shaped(&bridgepb.ResourcePatch{Index: 1}, fits),
		"records in metrics": shaped(fits, &bridgepb.ResourcePatch{Index: 1, Scopes: []*bridgepb.ScopePatch{{Index: 0, Records: []*bridgepb.ItemPatch{{Index: 0}}}}}),
		"fewer resources":    {ResourceCount: 1, ItemCount: 16, Resources: []*bridgepb.ResourcePatch{fits}},
		"more items":         {ResourceCount: 2, ItemCount: 17, Resources: []*bridgepb.ResourcePatch{fits}},
	}
	for name, patch := range cases {
		t.Run(name, func(t *testing.T) {
			md := patchBatch()
			err := patchMetrics(md, patch, md.DataPointCount())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "does not fit")
			assert.Equal(t, patchBatch(), md, "nothing applied")
		})
	}
	t.Run("metrics in a logs patch", func(t *testing.T) {
		ld := testLogs(1, "")
		err := patchLogsN(ld, &bridgepb.Patch{ResourceCount: 1, ItemCount: 1, Resources: []*bridgepb.ResourcePatch{
			{Index: 0, Scopes: []*bridgepb.ScopePatch{{Index: 0, Metrics: []*bridgepb.MetricPatch{{Index: 0}}}}}}})
		require.Error(t, err)
		assert.Equal(t, testLogs(1, ""), ld)
	})
	t.Run("span past the end", func(t *testing.T) {
		td := testTraces(1)
		err := patchTracesN(td, &bridgepb.Patch{ResourceCount: 1, ItemCount: 1, Resources: []*bridgepb.ResourcePatch{
			{Index: 0, Attributes: set(kv("a", str("b"))), Scopes: []*bridgepb.ScopePatch{{Index: 0, Records: []*bridgepb.ItemPatch{{Index: 1}}}}}}})
		require.Error(t, err)
		assert.Equal(t, testTraces(1), td)
	})
}

// labelByPatch answers every call with a patch labelling every resource, as gputally's
// bridge answers an annotating pipeline.
func labelByPatch(_ context.Context, signal, _ string, otlp []byte) (reply, error) {
	resources, items := shapeOf(signal, otlp)
	patch := &bridgepb.Patch{ResourceCount: uint32(resources), ItemCount: uint64(items)}
	for i := range resources {
		patch.Resources = append(patch.Resources, &bridgepb.ResourcePatch{Index: uint32(i), Attributes: set(kv(podKey, str(podName)))})
	}
	return reply{patch: patch}, nil
}

// shapeOf decodes a request of signal for its resource and item counts.
func shapeOf(signal string, otlp []byte) (resources, items int) {
	req := otlpRequest(signal, otlp)
	return req.resources(), req.items()
}

func TestPatchAnswerGoesThroughTheProcessor(t *testing.T) {
	for _, signal := range signals {
		t.Run(signal, func(t *testing.T) {
			fake, addr := startBridge(t, labelByPatch)
			p := newPipe(t, signal, testConfig(addr))

			require.NoError(t, p.consume(context.Background(), 3))

			delivered := p.delivered()
			require.Len(t, delivered, 3)
			for _, attrs := range delivered {
				pod, _ := attrs.Get(podKey)
				assert.Equal(t, podName, pod.Str())
			}
			assert.Equal(t, []bool{true}, fake.acceptPatch())
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_calls", map[string]string{"outcome": "ok"}))
		})
	}
}

func TestWholeBatchAnswerWhenThePatchIsNotAsked(t *testing.T) {
	fake, addr := startBridge(t, labelPods)
	cfg := testConfig(addr)
	cfg.AcceptPatch = false
	p := newPipe(t, "metrics", cfg)

	require.NoError(t, p.consume(context.Background(), 2))

	require.Len(t, p.delivered(), 2)
	assert.Equal(t, []bool{false}, fake.acceptPatch())
}

func TestUnaskedPatchIsAnInternalError(t *testing.T) {
	_, addr := startBridge(t, labelByPatch)
	cfg := testConfig(addr)
	cfg.AcceptPatch = false
	cfg.OnError = OnErrorFail
	p := newPipe(t, "metrics", cfg)

	err := p.consume(context.Background(), 2)

	require.Error(t, err)
	assert.Equal(t, codes.Internal, status.Code(err))
}

func TestMisfitPatchGoesThroughOnError(t *testing.T) {
	pastTheEnd := func(context.Context, string, string, []byte) (reply, error) {
		return reply{patch: &bridgepb.Patch{ResourceCount: 2, ItemCount: 2, Resources: []*bridgepb.ResourcePatch{
			{Index: 0, Attributes: set(kv(podKey, str(podName)))}, {Index: 5}}}}, nil
	}
	_, addr := startBridge(t, pastTheEnd)
	t.Run("fail", func(t *testing.T) {
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail
		p := newPipe(t, "metrics", cfg)
		err := p.consume(context.Background(), 2)
		require.Error(t, err)
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.True(t, consumererror.IsPermanent(err))
		assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_errors", map[string]string{"code": "InvalidArgument"}))
	})
	t.Run("pass", func(t *testing.T) {
		sink := new(consumertest.MetricsSink)
		proc, err := NewFactory().CreateMetrics(context.Background(), processortest.NewNopSettings(componentType), testConfig(addr), sink)
		require.NoError(t, err)
		require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
		t.Cleanup(func() { require.NoError(t, proc.Shutdown(context.Background())) })

		require.NoError(t, proc.ConsumeMetrics(context.Background(), testMetrics(2)))

		require.Len(t, sink.AllMetrics(), 1)
		assert.Equal(t, testMetrics(2), sink.AllMetrics()[0], "nothing of the refused patch was applied")
	})
}

// request is a decoded OTLP request of any signal, for its shape.
type request struct {
	resources func() int
	items     func() int
}

func otlpRequest(signal string, otlp []byte) request {
	switch signal {
	case "metrics":
		md, err := metricsCodec.unmarshal(otlp)
		must(err)
		return request{func() int { return md.ResourceMetrics().Len() }, md.DataPointCount}
	case "logs":
		ld, err := logsCodec.unmarshal(otlp)
		must(err)
		return request{func() int { return ld.ResourceLogs().Len() }, ld.LogRecordCount}
	default:
		td, err := tracesCodec.unmarshal(otlp)
		must(err)
		return request{func() int { return td.ResourceSpans().Len() }, td.SpanCount}
	}
}

func patchLogsN(ld plog.Logs, p *bridgepb.Patch) error { return patchLogs(ld, p, ld.LogRecordCount()) }

func patchTracesN(td ptrace.Traces, p *bridgepb.Patch) error {
	return patchTraces(td, p, td.SpanCount())
}

func TestPatchDroppingEveryResourceDropsTheBatch(t *testing.T) {
	dropAll := func(_ context.Context, signal, _ string, otlp []byte) (reply, error) {
		resources, items := shapeOf(signal, otlp)
		patch := &bridgepb.Patch{ResourceCount: uint32(resources), ItemCount: uint64(items)}
		for i := range resources {
			patch.Resources = append(patch.Resources, &bridgepb.ResourcePatch{Index: uint32(i), Drop: true})
		}
		return reply{patch: patch, droppedItems: int64(items)}, nil
	}
	_, addr := startBridge(t, dropAll)
	p := newPipe(t, "logs", testConfig(addr))

	require.NoError(t, p.consume(context.Background(), 3))

	assert.Empty(t, p.delivered())
	assert.Equal(t, int64(3), p.sum(t, "otelcol_processor_gputally_dropped_items", map[string]string{"reason": "pipeline"}),
		"the items as sent, counted before the patch removed them")
	assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_calls", map[string]string{"outcome": "dropped_all"}))
}
