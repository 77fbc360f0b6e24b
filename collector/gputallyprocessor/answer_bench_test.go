// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"fmt"
	"testing"

	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// nodeBatch is bench/gpu_node_request.py's shape: 8 GPU resources of 30 metrics and 10
// process resources of 10, one point each (340 points).
func nodeBatch() pmetric.Metrics {
	md := pmetric.NewMetrics()
	for r, metrics := range append([]int{30, 30, 30, 30, 30, 30, 30, 30}, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10) {
		rm := md.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("host.name", "gpu-node-001")
		rm.Resource().Attributes().PutStr("hw.id", fmt.Sprintf("GPU-%d", r))
		sm := rm.ScopeMetrics().AppendEmpty()
		for m := range metrics {
			metric := sm.Metrics().AppendEmpty()
			metric.SetName(fmt.Sprintf("hw.gpu.metric%d", m))
			dp := metric.SetEmptyGauge().DataPoints().AppendEmpty()
			dp.SetDoubleValue(float64(m))
			dp.SetTimestamp(1_795_977_093_000_000_000)
		}
	}
	return md
}

// BenchmarkAnswer compares what the processor does with each kind of answer for one node's
// batch with one attribute added to every resource: decode the whole answer into new pdata,
// or apply the patch in place. Figures only (`go test -bench Answer -benchmem`).
func BenchmarkAnswer(b *testing.B) {
	batch := nodeBatch()
	annotated := nodeBatch()
	patch := &bridgepb.Patch{ResourceCount: uint32(batch.ResourceMetrics().Len()), ItemCount: uint64(batch.DataPointCount())}
	for i := range annotated.ResourceMetrics().Len() {
		annotated.ResourceMetrics().At(i).Resource().Attributes().PutStr("k8s.cluster.name", "bench")
		patch.Resources = append(patch.Resources, &bridgepb.ResourcePatch{Index: uint32(i), Attributes: set(kv("k8s.cluster.name", str("bench")))})
	}
	whole, err := metricsCodec.marshal(annotated)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := metricsCodec.unmarshal(whole); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("patch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			md := nodeBatch()
			b.StartTimer()
			if err := patchMetrics(md, patch, 340); err != nil {
				b.Fatal(err)
			}
		}
	})
}
