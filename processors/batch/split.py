"""Cut a batch between resources without decoding it.

Every OTLP export request has one repeated field, number 1, of resource entries
(``resource_metrics``, ``resource_logs``, ``resource_spans``). A one-field schema that
declares it as ``repeated bytes`` lists each entry's encoding in one C-level parse, and
encodings join by concatenation, so parts are built from the received bytes: nothing is
decoded into OTLP messages or re-encoded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gputally.otlp.batch import Batch, Signal
from gputally.otlp.census import Census, census_logs, census_metrics, census_traces
from gputally.otlp.wire import encode_varint

__all__ = ["Entry", "entries", "pack", "split"]

_CENSUS: dict[Signal, Callable[[bytes], Census]] = {
    Signal.METRICS: census_metrics,
    Signal.LOGS: census_logs,
    Signal.TRACES: census_traces,
}


def _entry_list_class() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="gputally_batch_split.proto", package="gputally.split")
    message = fdp.message_type.add(name="Entries")
    message.field.add(
        name="entries",
        number=1,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gputally.split.Entries"))


_ENTRIES = _entry_list_class()


Entry = tuple[bytes, int]
"""One resource entry, encoded as a whole request of its own, and its item count."""


def entries(batch: Batch) -> list[Entry]:
    """The batch's resource entries in order, each a complete one-resource request."""
    count = _CENSUS[batch.signal]
    out = []
    for entry in _ENTRIES.FromString(batch.serialize()).entries:
        encoded = b"\x0a" + encode_varint(len(entry)) + entry
        out.append((encoded, count(encoded).items))
    return out


def pack(signal: Signal, parts: list[Entry]) -> Batch:
    """One batch of ``parts`` (entries from :func:`entries`), in order."""
    return Batch(signal, raw=b"".join(raw for raw, _ in parts), items=sum(items for _, items in parts))


def split(batch: Batch, limit: int) -> list[Batch]:
    """``batch`` cut between resources into batches of at most ``limit`` items each.

    Resources keep their order and are never cut, so a resource with more than ``limit``
    items makes a batch of its own.
    """
    signal = batch.signal
    out: list[Batch] = []
    part: list[Entry] = []
    held = 0
    for entry in entries(batch):
        if part and held + entry[1] > limit:
            out.append(pack(signal, part))
            part, held = [], 0
        part.append(entry)
        held += entry[1]
    if part:
        out.append(pack(signal, part))
    return out
