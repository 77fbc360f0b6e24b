"""Structure-aware generators: inputs shaped like the real thing, then bent.

Each generator first builds something valid in shape (an OTLP request with every metric
kind, a config from the shipped ones, a cgroup path from the shapes the parser knows, a
recording from the real H200 ones) and then damages it the way real inputs are damaged:
values of the wrong type, out-of-range numbers, unknown names, deleted keys, truncated or
flipped bytes. Random bytes alone would almost never get past the first check.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2

# -- bytes -----------------------------------------------------------------------------------


@st.composite
def damaged(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` unchanged, or cut, with bits flipped, bytes inserted, or a slice repeated."""
    kind = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert", "repeat", "varint"]))
    if not raw or kind == "none":
        return raw
    at = draw(st.integers(0, len(raw) - 1))
    if kind == "truncate":
        return raw[:at]
    if kind == "flip":
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            index = draw(st.integers(0, len(data) - 1))
            data[index] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if kind == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=16)) + raw[at:]
    if kind == "varint":  # a length or tag that never ends, or claims far too much
        return raw[:at] + b"\xff" * draw(st.integers(1, 11)) + raw[at:]
    end = draw(st.integers(at, min(len(raw), at + 64)))
    return raw[:end] + raw[at:end] * draw(st.integers(1, 8)) + raw[end:]


# -- OTLP ------------------------------------------------------------------------------------

KEYS = st.sampled_from(["host.name", "k8s.pod.uid", "gpu", "service.name", "", "x" * 300, "é", "\x00"])
TEXT = st.text(max_size=40)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
DOUBLES = st.floats(allow_nan=True, allow_infinity=True)


def _any_value() -> st.SearchStrategy[common_pb2.AnyValue]:
    scalars = st.one_of(
        st.builds(lambda v: common_pb2.AnyValue(string_value=v), TEXT),
        st.builds(lambda v: common_pb2.AnyValue(int_value=v), I64),
        st.builds(lambda v: common_pb2.AnyValue(double_value=v), DOUBLES),
        st.builds(lambda v: common_pb2.AnyValue(bool_value=v), st.booleans()),
        st.builds(lambda v: common_pb2.AnyValue(bytes_value=v), st.binary(max_size=16)),
        st.just(common_pb2.AnyValue()),
    )

    def nested(inner: st.SearchStrategy[common_pb2.AnyValue]) -> st.SearchStrategy[common_pb2.AnyValue]:
        def array(values: list[common_pb2.AnyValue]) -> common_pb2.AnyValue:
            value = common_pb2.AnyValue()
            value.array_value.values.extend(values)
            return value

        def kvlist(pairs: list[tuple[str, common_pb2.AnyValue]]) -> common_pb2.AnyValue:
            value = common_pb2.AnyValue()
            for key, item in pairs:
                value.kvlist_value.values.add(key=key).value.CopyFrom(item)
            return value

        return st.one_of(st.builds(array, st.lists(inner, max_size=3)),
                         st.builds(kvlist, st.lists(st.tuples(KEYS, inner), max_size=3)))

    return st.recursive(scalars, nested, max_leaves=6)


ANY_VALUE = _any_value()
ATTRIBUTES = st.lists(st.tuples(KEYS, ANY_VALUE), max_size=4)


def _set_attributes(target: Any, pairs: list[tuple[str, common_pb2.AnyValue]]) -> None:
    for key, value in pairs:
        target.add(key=key).value.CopyFrom(value)


@st.composite
def _number_point(draw: st.DrawFn, points: Any) -> None:
    point = points.add(start_time_unix_nano=draw(U64), time_unix_nano=draw(U64), flags=draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        point.as_int = draw(I64)
    else:
        point.as_double = draw(DOUBLES)
    _set_attributes(point.attributes, draw(ATTRIBUTES))
    if draw(st.integers(0, 4)) == 0:
        exemplar = point.exemplars.add(time_unix_nano=draw(U64), as_double=draw(DOUBLES))
        exemplar.trace_id = draw(st.binary(min_size=0, max_size=20))
        exemplar.span_id = draw(st.binary(min_size=0, max_size=10))


@st.composite
def metrics_request(draw: st.DrawFn) -> ExportMetricsServiceRequest:
    """Every metric kind, with names that are valid, empty or odd, and extreme values."""
    request = ExportMetricsServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rm = request.resource_metrics.add(schema_url=draw(TEXT))
        _set_attributes(rm.resource.attributes, draw(ATTRIBUTES))
        for _ in range(draw(st.integers(0, 2))):
            sm = rm.scope_metrics.add()
            sm.scope.name, sm.scope.version = draw(TEXT), draw(TEXT)
            for _ in range(draw(st.integers(0, 3))):
                metric = sm.metrics.add(name=draw(st.sampled_from(["gpu.utilization", "", "DCGM_FI_DEV_GPU_UTIL",
                                                                    "x" * 1000])), unit=draw(TEXT))
                kind = draw(st.sampled_from(["gauge", "sum", "histogram", "exponential_histogram", "summary", "none"]))
                for _ in range(draw(st.integers(0, 3))):
                    if kind == "gauge":
                        draw(_number_point(metric.gauge.data_points))
                    elif kind == "sum":
                        metric.sum.aggregation_temporality = draw(st.integers(0, 5))
                        metric.sum.is_monotonic = draw(st.booleans())
                        draw(_number_point(metric.sum.data_points))
                    elif kind == "histogram":
                        metric.histogram.aggregation_temporality = draw(st.integers(0, 5))
                        point = metric.histogram.data_points.add(count=draw(U64), sum=draw(DOUBLES))
                        point.bucket_counts.extend(draw(st.lists(U64, max_size=5)))
                        point.explicit_bounds.extend(draw(st.lists(DOUBLES, max_size=5)))
                    elif kind == "exponential_histogram":
                        point = metric.exponential_histogram.data_points.add(
                            count=draw(U64), scale=draw(st.integers(-(2**31), 2**31 - 1)),
                            zero_count=draw(U64))
                        point.positive.offset = draw(st.integers(-(2**31), 2**31 - 1))
                        point.positive.bucket_counts.extend(draw(st.lists(U64, max_size=5)))
                    elif kind == "summary":
                        point = metric.summary.data_points.add(count=draw(U64), sum=draw(DOUBLES))
                        point.quantile_values.add(quantile=draw(DOUBLES), value=draw(DOUBLES))
    return request


@st.composite
def logs_request(draw: st.DrawFn) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rl = request.resource_logs.add()
        _set_attributes(rl.resource.attributes, draw(ATTRIBUTES))
        sl = rl.scope_logs.add()
        for _ in range(draw(st.integers(0, 3))):
            record = sl.log_records.add(time_unix_nano=draw(U64), severity_number=draw(st.integers(0, 30)),
                                        severity_text=draw(TEXT))
            record.body.CopyFrom(draw(ANY_VALUE))
            record.trace_id = draw(st.binary(max_size=20))
            _set_attributes(record.attributes, draw(ATTRIBUTES))
    return request


@st.composite
def traces_request(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = request.resource_spans.add()
        _set_attributes(rs.resource.attributes, draw(ATTRIBUTES))
        ss = rs.scope_spans.add()
        for _ in range(draw(st.integers(0, 3))):
            span = ss.spans.add(name=draw(TEXT), kind=draw(st.integers(0, 9)), start_time_unix_nano=draw(U64))
            span.trace_id = draw(st.binary(max_size=20))
            span.span_id = draw(st.binary(max_size=10))
            span.status.code = draw(st.integers(0, 5))
            _set_attributes(span.attributes, draw(ATTRIBUTES))
    return request


REQUESTS = {"metrics": metrics_request(), "logs": logs_request(), "traces": traces_request()}


# -- JSON (and YAML) documents ------------------------------------------------------------------

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    TEXT, st.sampled_from(["NOPE", "AGGREGATION_TEMPORALITY_DELTA", "SPAN_KIND_SERVER", "zz", "0x10", "1e999",
                           "${env:UNSET}", "${env:HOME}", "$$", "-1", "9" * 30]),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON-like tree, the root first."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(paths(value, (*prefix, index)))
    return found


def _parent(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


@st.composite
def bent(draw: st.DrawFn, tree: Any, *, keys: st.SearchStrategy[str] = TEXT, edits: int = 3) -> Any:
    """A copy of ``tree`` with up to ``edits`` places replaced, deleted, or given a new key."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(0, edits))):
        places = paths(tree)
        path = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap"]))
        if not path:
            if action == "replace":
                tree = draw(JSON_VALUES)
            continue
        parent, last = _parent(tree, path), path[-1]
        if action == "replace":
            parent[last] = draw(JSON_VALUES)
        elif action == "delete":
            del parent[last]
        elif action == "wrap":
            parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
        elif isinstance(parent[last], dict):
            parent[last][draw(keys)] = draw(JSON_VALUES)
        elif isinstance(parent[last], list):
            parent[last].append(draw(JSON_VALUES))
    return tree


def json_bytes(tree: Any) -> bytes:
    return json.dumps(tree).encode()


# -- cgroup lines -----------------------------------------------------------------------------

_HEX = "0123456789abcdef"
_IDS = st.one_of(st.integers(0, 2**32 + 5).map(str), st.text("0123456789", min_size=1, max_size=40),
                 st.sampled_from(["9" * 5000, "-1", "0x10", "1e9", "٣"]))
_UID = st.text(_HEX, min_size=32, max_size=32).map(lambda h: f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
_CID = st.text(_HEX, min_size=60, max_size=68)


def _pod_slice(uid: str) -> str:
    return f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"


cgroup_component = st.one_of(
    st.sampled_from(["kubepods.slice", "kubepods", "burstable", "besteffort", "kubelet.slice", "system.slice",
                     "user.slice", "slurmstepd.scope", "slurm", "docker", "..", "", "\x00", "é"]),
    _UID.map(_pod_slice), _UID.map(lambda uid: f"kubepods-pod{uid}.slice"), _UID.map(lambda uid: f"pod{uid}"),
    _CID.map(lambda cid: f"cri-containerd-{cid}.scope"), _CID.map(lambda cid: f"crio-{cid}.scope"),
    _CID.map(lambda cid: f"docker-{cid}.scope"), _CID,
    _IDS.map(lambda i: f"uid_{i}"), _IDS.map(lambda i: f"job_{i}"), _IDS.map(lambda i: f"task_{i}"),
    st.one_of(_IDS, st.sampled_from(["batch", "extern"])).map(lambda i: f"step_{i}"),
    TEXT,
)
"""One component of a cgroup path, in one of the shapes the parser knows (or not)."""


@st.composite
def cgroup_text(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        hierarchy = draw(st.sampled_from(["0::", "11:memory:", "1:name=systemd:", "4:cpu,cpuacct:", "x", "::", ""]))
        components = draw(st.lists(cgroup_component, max_size=8))
        lines.append(hierarchy + "/" + "/".join(components))
    return draw(st.sampled_from(["\n", "\r\n", "\n\n"])).join(lines)
