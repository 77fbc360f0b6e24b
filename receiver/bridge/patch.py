"""A bridge answer as a patch: what an annotating pipeline changed in the batch, not the batch.

When every processor of a pipeline declares that it only annotates (its factory's
``annotates``: it changes resource attributes and nothing else), the batch that comes out
differs from the one that went in only in its resources' encodings. The patch is read off
those: each resource entry's encoding before and after, found by the splice schema
(:func:`gputally.otlp.splice.split`, which leaves scopes and points as bytes), and for each
resource whose bytes changed, the attributes set and removed. Nothing is decoded or encoded
whole; a resource pair is diffed once and its encoded change reused for as long as the same
GPU sends the same resource (every cycle), so the steady state costs two splits and a lookup
per resource, and a node's request whose resources match its last one reuses that patch whole.
A change a patch cannot say (a resource field other than attributes, duplicate
keys, a different number of entries) makes :meth:`Patches.build` return None, and the
caller answers with the whole batch.

The Collector's ``gputally`` processor applies the patch to the batch it holds
(``proto/bridge/README.md``, "Patch answers").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally.otlp.splice import split
from gputally.otlp.wire import encode_varint
from gputally.proto.bridge.v1 import bridge_pb2

__all__ = ["Patches", "nameless_metrics", "response_field"]

_LIMIT = 16384
"""Resource pairs whose change is kept (cleared when full, as the k8s processor's decisions)."""
_REQUESTS = 1024
"""Request shapes whose last patch is kept (cleared when full): with an 8-GPU node's 18
resources, about 12 KB each, so at most about 12 MB; the changes' cache holds about as much."""
_UNSAYABLE = b"\xff"
"""Cached for a pair whose change a patch cannot say (never a valid encoded Attributes)."""

Drops = Mapping[int, Mapping[int, Sequence[int]]]
"""Metrics to drop: resource position -> scope position -> metric positions."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    return encode_varint(n)


def _len_field(tag: int, body: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(body)) + body


def response_field(patch: bytes) -> bytes:
    """An encoded ``Patch`` as the ``patch`` field (4) of any ``Process*Response``: appended to
    the rest of the response's encoding, it is that response with the patch set."""
    return _len_field(0x22, patch)


def _attributes_change(before: bytes, after: bytes) -> bytes | None:
    """The encoded ``Attributes`` that turns resource ``before`` into ``after``; None when
    they differ in more than attributes, or either has a key twice (a map cannot hold it)."""
    old, new = Resource.FromString(before), Resource.FromString(after)
    old_values = {kv.key: kv.value.SerializeToString(deterministic=True) for kv in old.attributes}
    new_values = {kv.key: kv.value.SerializeToString(deterministic=True) for kv in new.attributes}
    if len(old_values) != len(old.attributes) or len(new_values) != len(new.attributes):
        return None
    del old.attributes[:]
    del new.attributes[:]
    if old.SerializeToString(deterministic=True) != new.SerializeToString(deterministic=True):
        return None  # dropped_attributes_count, entity references or unknown fields changed
    change = bridge_pb2.Attributes()
    for kv in Resource.FromString(after).attributes:
        if old_values.get(kv.key) != new_values[kv.key]:
            change.set.add().MergeFromString(kv.SerializeToString())  # wire-identical KeyValues
    change.remove.extend(key for key in old_values if key not in new_values)
    return change.SerializeToString()


def nameless_metrics(otlp: bytes) -> dict[int, dict[int, list[int]]]:
    """Where a metrics request has metrics without a name (which gputally drops as invalid)."""
    drops: dict[int, dict[int, list[int]]] = {}
    for i, resource in enumerate(ExportMetricsServiceRequest.FromString(otlp).resource_metrics):
        for j, scope in enumerate(resource.scope_metrics):
            nameless = [k for k, metric in enumerate(scope.metrics) if not metric.name]
            if nameless:
                drops.setdefault(i, {})[j] = nameless
    return drops


def _scope_drops(scopes: Mapping[int, Sequence[int]]) -> bytes:
    patches = b""
    for j in sorted(scopes):
        scope = bridge_pb2.ScopePatch(index=j)
        for k in scopes[j]:
            scope.metrics.add(index=k, drop=True)
        patches += _len_field(0x22, scope.SerializeToString())  # ResourcePatch.scopes = 4
    return patches


class Patches:
    """Builds patch answers, remembering each resource pair's encoded change."""

    def __init__(self) -> None:
        self._changes: dict[bytes, tuple[bytes, bytes]] = {}
        """A resource's encoding after -> its encoding before and the encoded change (keyed by
        one side only: hashing is what a lookup costs, comparing the other side is a memcmp)."""
        self._requests: dict[tuple[int, int, int], tuple[list[bytes], list[bytes], bytes]] = {}
        """By request and answer length and items: the resources before and after, and the
        patch, of the last such request (compared whole, so a stale entry is only a miss)."""

    def build(self, before: bytes, after: bytes, *, items: int, drops: Drops | None = None) -> bytes | None:
        """The encoded ``Patch`` turning request ``before`` (of ``items`` items as sent) into
        ``after``, plus ``drops``; None when a patch cannot say the difference."""
        old = [entry.resource for entry in split(before).entries]
        if after is before or after == before:
            new = old
        else:
            new = [entry.resource for entry in split(after).entries]
            if len(new) != len(old):
                return None
        key = (len(before), len(after), items)
        if not drops:  # a node sends the same resources every cycle: its last patch, if they match
            last = self._requests.get(key)
            if last is not None and last[0] == old and last[1] == new:
                return last[2]
        patch = self._patch(old, new, items, drops)
        if patch is not None and not drops:
            if len(self._requests) >= _REQUESTS:
                self._requests.clear()
            self._requests[key] = (old, new, patch)
        return patch

    def _patch(self, old: list[bytes], new: list[bytes], items: int, drops: Drops | None) -> bytes | None:
        changes = self._changes
        changed: dict[int, bytes] = {}
        if new is not old:
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                if a == b:
                    continue
                known = changes.get(b)
                if known is None or known[0] != a:
                    change = _attributes_change(a, b)
                    known = (a, _UNSAYABLE if change is None else _len_field(0x12, change))  # ResourcePatch.attributes = 2
                    if len(changes) >= _LIMIT:
                        changes.clear()
                    changes[b] = known
                field = known[1]
                if field is _UNSAYABLE:
                    return None
                changed[i] = field
        out = [b"\x08", _varint(len(old)), b"\x10", _varint(items)]  # resource_count, item_count
        positions = sorted(changed.keys() | drops.keys()) if drops else changed  # changed: in index order
        for i in positions:
            body = b"\x08" + _varint(i) + changed.get(i, b"")
            if drops and i in drops:
                body += _scope_drops(drops[i])
            out.append(_len_field(0x1A, body))  # Patch.resources = 3
        return b"".join(out)
