// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"fmt"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// A patch answer (proto/bridge/README.md, "Patch answers") is applied to the batch the
// processor already holds, in place: no new pdata is decoded, so an annotation costs what
// its attributes cost. Every patch is walked twice, first to check it against the batch
// (nothing is changed if any part is wrong), then to apply it; the two walks are one code
// path with `apply` off and on, so what was checked is what is applied.

// patchWalk is one walk over a patch; apply false only checks it.
type patchWalk struct {
	apply bool
}

// errPatch is a patch that does not fit the batch: the client refuses it (INVALID_ARGUMENT).
func errPatch(format string, args ...any) error {
	return fmt.Errorf("the patch does not fit the batch: "+format, args...)
}

// checkShape compares the batch's shape with the one the patch was made for.
func checkShape(p *bridgepb.Patch, resources, items int) error {
	if int(p.GetResourceCount()) != resources || p.GetItemCount() != uint64(items) {
		return errPatch("made for %d resources and %d items, the batch has %d and %d",
			p.GetResourceCount(), p.GetItemCount(), resources, items)
	}
	return nil
}

// indexes checks that a list of patches addresses positions below n in strictly increasing
// order (so no position is patched twice) and says which positions drop.
func indexes[P interface {
	GetIndex() uint32
}](where string, patches []P, n int, drops func(P) bool) (map[int]bool, error) {
	var dropped map[int]bool
	last := -1
	for _, p := range patches {
		i := int(p.GetIndex())
		if i >= n {
			return nil, errPatch("%s %d is past the end (%d)", where, i, n)
		}
		if i <= last {
			return nil, errPatch("%s %d is out of order (after %d)", where, i, last)
		}
		last = i
		if drops(p) {
			if dropped == nil {
				dropped = map[int]bool{}
			}
			dropped[i] = true
		}
	}
	return dropped, nil
}

// attributes applies one Attributes change to an attribute map.
func (w patchWalk) attributes(attrs pcommon.Map, a *bridgepb.Attributes) {
	if !w.apply || a == nil {
		return
	}
	for _, key := range a.GetRemove() {
		attrs.Remove(key)
	}
	for _, kv := range a.GetSet() {
		putValue(attrs.PutEmpty(kv.GetKey()), kv.GetValue())
	}
}

// putValue writes an OTLP AnyValue into dst (an unset value stays empty, as OTLP's).
func putValue(dst pcommon.Value, v *bridgepb.AnyValue) {
	switch x := v.GetValue().(type) {
	case *bridgepb.AnyValue_StringValue:
		dst.SetStr(x.StringValue)
	case *bridgepb.AnyValue_BoolValue:
		dst.SetBool(x.BoolValue)
	case *bridgepb.AnyValue_IntValue:
		dst.SetInt(x.IntValue)
	case *bridgepb.AnyValue_DoubleValue:
		dst.SetDouble(x.DoubleValue)
	case *bridgepb.AnyValue_BytesValue:
		dst.SetEmptyBytes().FromRaw(x.BytesValue)
	case *bridgepb.AnyValue_ArrayValue:
		slice := dst.SetEmptySlice()
		values := x.ArrayValue.GetValues()
		slice.EnsureCapacity(len(values))
		for _, e := range values {
			putValue(slice.AppendEmpty(), e)
		}
	case *bridgepb.AnyValue_KvlistValue:
		m := dst.SetEmptyMap()
		values := x.KvlistValue.GetValues()
		m.EnsureCapacity(len(values))
		for _, kv := range values {
			putValue(m.PutEmpty(kv.GetKey()), kv.GetValue())
		}
	}
}

// items walks the patches of one list of data points, log records or spans: n of them,
// attrs(i) the attributes of the i-th, remove drops those the patch marks.
func (w patchWalk) items(where string, patches []*bridgepb.ItemPatch, n int, attrs func(int) pcommon.Map,
	remove func(dropped map[int]bool)) error {
	dropped, err := indexes(where, patches, n, (*bridgepb.ItemPatch).GetDrop)
	if err != nil || !w.apply {
		return err
	}
	for _, p := range patches {
		if !p.GetDrop() {
			w.attributes(attrs(int(p.GetIndex())), p.GetAttributes())
		}
	}
	if dropped != nil {
		remove(dropped)
	}
	return nil
}

// removeIf adapts a position set to pdata's RemoveIf, which visits entries in order.
func removeIf[E any](dropped map[int]bool) func(E) bool {
	i := -1
	return func(E) bool {
		i++
		return dropped[i]
	}
}

// resources walks the resource level, common to every signal: res(i) is the i-th entry's
// Resource attributes, scopes(i, patches) walks its scope patches, remove drops entries.
func (w patchWalk) resources(p *bridgepb.Patch, n int, res func(int) pcommon.Map,
	scopes func(i int, patches []*bridgepb.ScopePatch) error, remove func(map[int]bool)) error {
	dropped, err := indexes("resource", p.GetResources(), n, (*bridgepb.ResourcePatch).GetDrop)
	if err != nil {
		return err
	}
	for _, rp := range p.GetResources() {
		if rp.GetDrop() {
			continue
		}
		i := int(rp.GetIndex())
		w.attributes(res(i), rp.GetAttributes())
		if err := scopes(i, rp.GetScopes()); err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
	}
	if w.apply && dropped != nil {
		remove(dropped)
	}
	return nil
}

// scopeList walks one resource entry's scope patches: scope(j) is the j-th scope's
// attributes, children(j, sp) walks its metrics or records.
func (w patchWalk) scopeList(patches []*bridgepb.ScopePatch, n int, scope func(int) pcommon.Map,
	children func(j int, sp *bridgepb.ScopePatch) error, remove func(map[int]bool)) error {
	dropped, err := indexes("scope", patches, n, (*bridgepb.ScopePatch).GetDrop)
	if err != nil {
		return err
	}
	for _, sp := range patches {
		if sp.GetDrop() {
			continue
		}
		j := int(sp.GetIndex())
		w.attributes(scope(j), sp.GetAttributes())
		if err := children(j, sp); err != nil {
			return fmt.Errorf("scope %d: %w", j, err)
		}
	}
	if w.apply && dropped != nil {
		remove(dropped)
	}
	return nil
}

// applyPatch checks p against data with walk, then applies it: nothing changes on an error.
// (patchMetrics, patchLogs and patchTraces take the batch's item count from the caller, who
// counted it before the call.)
func applyPatch(p *bridgepb.Patch, walk func(patchWalk) error) error {
	if err := walk(patchWalk{apply: false}); err != nil {
		return err
	}
	return walk(patchWalk{apply: true})
}

func patchMetrics(md pmetric.Metrics, p *bridgepb.Patch, items int) error {
	if err := checkShape(p, md.ResourceMetrics().Len(), items); err != nil {
		return err
	}
	rms := md.ResourceMetrics()
	return applyPatch(p, func(w patchWalk) error {
		return w.resources(p, rms.Len(),
			func(i int) pcommon.Map { return rms.At(i).Resource().Attributes() },
			func(i int, patches []*bridgepb.ScopePatch) error {
				sms := rms.At(i).ScopeMetrics()
				return w.scopeList(patches, sms.Len(),
					func(j int) pcommon.Map { return sms.At(j).Scope().Attributes() },
					func(j int, sp *bridgepb.ScopePatch) error {
						if len(sp.GetRecords()) > 0 {
							return errPatch("records in a metrics patch")
						}
						return w.metrics(sp.GetMetrics(), sms.At(j).Metrics())
					},
					func(d map[int]bool) { sms.RemoveIf(removeIf[pmetric.ScopeMetrics](d)) })
			},
			func(d map[int]bool) { rms.RemoveIf(removeIf[pmetric.ResourceMetrics](d)) })
	})
}

func (w patchWalk) metrics(patches []*bridgepb.MetricPatch, ms pmetric.MetricSlice) error {
	dropped, err := indexes("metric", patches, ms.Len(), (*bridgepb.MetricPatch).GetDrop)
	if err != nil {
		return err
	}
	for _, mp := range patches {
		if mp.GetDrop() {
			continue
		}
		k := int(mp.GetIndex())
		if err := w.points(mp.GetPoints(), ms.At(k)); err != nil {
			return fmt.Errorf("metric %d: %w", k, err)
		}
	}
	if w.apply && dropped != nil {
		ms.RemoveIf(removeIf[pmetric.Metric](dropped))
	}
	return nil
}

// points walks one metric's data point patches, whichever kind of points it holds.
func (w patchWalk) points(patches []*bridgepb.ItemPatch, m pmetric.Metric) error {
	switch m.Type() {
	case pmetric.MetricTypeGauge:
		return numberPoints(w, patches, m.Gauge().DataPoints())
	case pmetric.MetricTypeSum:
		return numberPoints(w, patches, m.Sum().DataPoints())
	case pmetric.MetricTypeHistogram:
		dps := m.Histogram().DataPoints()
		return w.items("point", patches, dps.Len(), func(i int) pcommon.Map { return dps.At(i).Attributes() },
			func(d map[int]bool) { dps.RemoveIf(removeIf[pmetric.HistogramDataPoint](d)) })
	case pmetric.MetricTypeExponentialHistogram:
		dps := m.ExponentialHistogram().DataPoints()
		return w.items("point", patches, dps.Len(), func(i int) pcommon.Map { return dps.At(i).Attributes() },
			func(d map[int]bool) { dps.RemoveIf(removeIf[pmetric.ExponentialHistogramDataPoint](d)) })
	case pmetric.MetricTypeSummary:
		dps := m.Summary().DataPoints()
		return w.items("point", patches, dps.Len(), func(i int) pcommon.Map { return dps.At(i).Attributes() },
			func(d map[int]bool) { dps.RemoveIf(removeIf[pmetric.SummaryDataPoint](d)) })
	default: // a metric without data has no points to address
		return w.items("point", patches, 0, nil, nil)
	}
}

func numberPoints(w patchWalk, patches []*bridgepb.ItemPatch, dps pmetric.NumberDataPointSlice) error {
	return w.items("point", patches, dps.Len(), func(i int) pcommon.Map { return dps.At(i).Attributes() },
		func(d map[int]bool) { dps.RemoveIf(removeIf[pmetric.NumberDataPoint](d)) })
}

// noMetrics refuses metric patches in a logs or traces patch.
func noMetrics(sp *bridgepb.ScopePatch) error {
	if len(sp.GetMetrics()) > 0 {
		return errPatch("metrics in a patch of another signal")
	}
	return nil
}

func patchLogs(ld plog.Logs, p *bridgepb.Patch, items int) error {
	if err := checkShape(p, ld.ResourceLogs().Len(), items); err != nil {
		return err
	}
	rls := ld.ResourceLogs()
	return applyPatch(p, func(w patchWalk) error {
		return w.resources(p, rls.Len(),
			func(i int) pcommon.Map { return rls.At(i).Resource().Attributes() },
			func(i int, patches []*bridgepb.ScopePatch) error {
				sls := rls.At(i).ScopeLogs()
				return w.scopeList(patches, sls.Len(),
					func(j int) pcommon.Map { return sls.At(j).Scope().Attributes() },
					func(j int, sp *bridgepb.ScopePatch) error {
						if err := noMetrics(sp); err != nil {
							return err
						}
						recs := sls.At(j).LogRecords()
						return w.items("record", sp.GetRecords(), recs.Len(),
							func(k int) pcommon.Map { return recs.At(k).Attributes() },
							func(d map[int]bool) { recs.RemoveIf(removeIf[plog.LogRecord](d)) })
					},
					func(d map[int]bool) { sls.RemoveIf(removeIf[plog.ScopeLogs](d)) })
			},
			func(d map[int]bool) { rls.RemoveIf(removeIf[plog.ResourceLogs](d)) })
	})
}

func patchTraces(td ptrace.Traces, p *bridgepb.Patch, items int) error {
	if err := checkShape(p, td.ResourceSpans().Len(), items); err != nil {
		return err
	}
	rss := td.ResourceSpans()
	return applyPatch(p, func(w patchWalk) error {
		return w.resources(p, rss.Len(),
			func(i int) pcommon.Map { return rss.At(i).Resource().Attributes() },
			func(i int, patches []*bridgepb.ScopePatch) error {
				sss := rss.At(i).ScopeSpans()
				return w.scopeList(patches, sss.Len(),
					func(j int) pcommon.Map { return sss.At(j).Scope().Attributes() },
					func(j int, sp *bridgepb.ScopePatch) error {
						if err := noMetrics(sp); err != nil {
							return err
						}
						spans := sss.At(j).Spans()
						return w.items("span", sp.GetRecords(), spans.Len(),
							func(k int) pcommon.Map { return spans.At(k).Attributes() },
							func(d map[int]bool) { spans.RemoveIf(removeIf[ptrace.Span](d)) })
					},
					func(d map[int]bool) { sss.RemoveIf(removeIf[ptrace.ScopeSpans](d)) })
			},
			func(d map[int]bool) { rss.RemoveIf(removeIf[ptrace.ResourceSpans](d)) })
	})
}
