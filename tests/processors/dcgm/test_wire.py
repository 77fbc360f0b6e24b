"""Cutting a point's encoding into attribute entries and the rest, for every point class."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    NumberDataPoint,
    SummaryDataPoint,
)

from gputally.otlp.wire import encode_varint
from gputally.processors.dcgm.wire import attributes_tag, split_attributes

CLASSES = (NumberDataPoint, HistogramDataPoint, ExponentialHistogramDataPoint, SummaryDataPoint)


def filled(point_class: type[Any], labels: list[tuple[str, str]]) -> Any:
    point = point_class(attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in labels],
                        time_unix_nano=1_795_988_798_105_000_000, start_time_unix_nano=7, flags=1)
    if point_class is NumberDataPoint:
        point.as_double = 612.5
        point.exemplars.add(as_int=3, time_unix_nano=9).filtered_attributes.add(key="trace", value=AnyValue())
    elif point_class is HistogramDataPoint:
        point.count, point.sum, point.min, point.max = 3, 4.5, 0.5, 2.0
        point.bucket_counts.extend([1, 2])
        point.explicit_bounds.append(1.0)
    elif point_class is ExponentialHistogramDataPoint:
        point.count, point.scale, point.zero_count = 300, -2, 1
        point.positive.bucket_counts.extend(range(200))
    else:
        point.count, point.sum = 2, 3.0
        point.quantile_values.add(quantile=0.99, value=1.5)
    return point


def check(point: Any) -> None:
    raw = point.SerializeToString()
    rest, entries = split_attributes(raw, attributes_tag(type(point)))
    assert len(b"".join(rest + entries)) == len(raw)
    for piece in rest + entries:  # each a whole field: parses on its own
        type(point).FromString(piece)
    assert [KeyValue.FromString(_payload(e)) for e in entries] == list(point.attributes)
    rebuilt = type(point)()
    rebuilt.MergeFromString(b"".join(rest) + b"".join(entries))
    assert rebuilt == point
    assert len(type(point).FromString(b"".join(rest)).attributes) == 0


def _payload(entry: bytes) -> bytes:
    """A length-delimited field's payload (tag of one byte, then a varint length)."""
    i, length, shift = 1, 0, 0
    while True:
        byte = entry[i]
        i += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return entry[i:i + length]


@pytest.mark.parametrize("point_class", CLASSES)
def test_every_point_class(point_class: type[Any]) -> None:
    check(filled(point_class, [("UUID", "GPU-1"), ("gpu", "0"), ("pod", "p" * 300)]))  # a 2-byte length
    check(filled(point_class, []))


def test_unknown_fields_with_long_tags_are_kept_whole() -> None:
    point = filled(NumberDataPoint, [("UUID", "GPU-1")])
    point.MergeFromString(encode_varint((1000 << 3) | 0) + encode_varint(2**40) + encode_varint((2000 << 3) | 5) + b"abcd")
    check(point)


def test_a_truncated_encoding_is_refused() -> None:
    raw = filled(NumberDataPoint, [("UUID", "GPU-1")]).SerializeToString()
    with pytest.raises(IndexError):
        split_attributes(raw[:-1], attributes_tag(NumberDataPoint))


@given(
    point_class=st.sampled_from(CLASSES),
    labels=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=200)), max_size=12),
)
def test_any_labels(point_class: type[Any], labels: list[tuple[str, str]]) -> None:
    check(filled(point_class, labels))
