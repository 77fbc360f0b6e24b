"""Append attributes to the resources of an encoded OTLP request without decoding its points.

Attribution only ever adds attributes to resources, so the points need never be decoded
or encoded again: the request is parsed with a *splice schema* that declares only the
resource of each entry (``resource_metrics``/``resource_logs``/``resource_spans``, field 1,
all holding ``resource`` as field 1), as raw bytes. Everything else (scopes, metrics,
points) is kept as unknown fields, which protobuf carries through a parse and a serialize
as opaque bytes. Appending an encoded KeyValue (field 1 of Resource) to a resource's bytes
is appending an attribute. A 340-point request is split and rejoined in a few
microseconds, where re-encoding it costs a hundred.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["split"]

_PACKAGE = "gputally.k8s.splice"


def _request_class() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="gputally_k8s_splice.proto", package=_PACKAGE, syntax="proto3")
    entry = fdp.message_type.add(name="Entry")
    entry.field.add(name="resource", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                    type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES)
    request = fdp.message_type.add(name="Request")
    request.field.add(name="entries", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, type_name=f".{_PACKAGE}.Entry")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Request"))


_REQUEST = _request_class()


def split(raw: bytes) -> Any:
    """The request's entries, each with ``resource`` (the Resource's encoding, settable);
    ``SerializeToString()`` gives the request back with whatever resources were changed.
    Raises ``google.protobuf.message.DecodeError`` on bytes that are not a request."""
    return _REQUEST.FromString(raw)
