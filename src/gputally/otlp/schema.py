"""Private protobuf schemas built in code, for parsing OTLP bytes another way than OTLP's own.

The census (:mod:`.census`) and the splice (:mod:`.splice`) read requests through messages
that reuse OTLP's field numbers but declare some levels differently (merged, or as raw
bytes). Each lives in a pool of its own, so its names never meet OTLP's.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Field", "SchemaFile"]

Field = tuple[str, int, int, int, str | None]
"""(name, number, label, type, message type name in the same file or None)."""


class SchemaFile:
    """One ``.proto`` file's messages, declared field by field, then turned into classes."""

    def __init__(self, name: str, package: str, *, syntax: str = "proto3") -> None:
        self._package = package
        self._proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax=syntax)

    def message(self, name: str, *fields: Field) -> descriptor_pb2.DescriptorProto:
        """Declare message ``name`` with ``fields``; its proto, for oneofs and the like."""
        proto = self._proto.message_type.add(name=name)
        for field_name, number, label, type_, type_name in fields:
            field = proto.field.add(name=field_name, number=number, label=label, type=type_)
            if type_name:
                field.type_name = f".{self._package}.{type_name}"
        return proto

    def classes(self, *names: str) -> dict[str, Any]:
        """The message classes of ``names``, from a pool holding only this file."""
        pool = descriptor_pool.DescriptorPool()
        pool.Add(self._proto)
        return {
            name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{self._package}.{name}"))
            for name in names
        }
