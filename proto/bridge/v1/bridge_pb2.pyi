from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessMetricsRequest(_message.Message):
    __slots__ = ("otlp", "pipeline")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ...) -> None: ...

class ProcessMetricsResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ProcessLogsRequest(_message.Message):
    __slots__ = ("otlp", "pipeline")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ...) -> None: ...

class ProcessLogsResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ProcessTracesRequest(_message.Message):
    __slots__ = ("otlp", "pipeline")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ...) -> None: ...

class ProcessTracesResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...
