from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessMetricsRequest(_message.Message):
    __slots__ = ("otlp", "pipeline", "accept_patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    accept_patch: bool
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ..., accept_patch: bool = ...) -> None: ...

class ProcessMetricsResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message", "patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    patch: Patch
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ..., patch: _Optional[_Union[Patch, _Mapping]] = ...) -> None: ...

class ProcessLogsRequest(_message.Message):
    __slots__ = ("otlp", "pipeline", "accept_patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    accept_patch: bool
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ..., accept_patch: bool = ...) -> None: ...

class ProcessLogsResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message", "patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    patch: Patch
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ..., patch: _Optional[_Union[Patch, _Mapping]] = ...) -> None: ...

class ProcessTracesRequest(_message.Message):
    __slots__ = ("otlp", "pipeline", "accept_patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    pipeline: str
    accept_patch: bool
    def __init__(self, otlp: _Optional[bytes] = ..., pipeline: _Optional[str] = ..., accept_patch: bool = ...) -> None: ...

class ProcessTracesResponse(_message.Message):
    __slots__ = ("otlp", "dropped_items", "error_message", "patch")
    OTLP_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    otlp: bytes
    dropped_items: int
    error_message: str
    patch: Patch
    def __init__(self, otlp: _Optional[bytes] = ..., dropped_items: _Optional[int] = ..., error_message: _Optional[str] = ..., patch: _Optional[_Union[Patch, _Mapping]] = ...) -> None: ...

class Patch(_message.Message):
    __slots__ = ("resource_count", "item_count", "resources")
    RESOURCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resource_count: int
    item_count: int
    resources: _containers.RepeatedCompositeFieldContainer[ResourcePatch]
    def __init__(self, resource_count: _Optional[int] = ..., item_count: _Optional[int] = ..., resources: _Optional[_Iterable[_Union[ResourcePatch, _Mapping]]] = ...) -> None: ...

class ResourcePatch(_message.Message):
    __slots__ = ("index", "attributes", "drop", "scopes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    index: int
    attributes: Attributes
    drop: bool
    scopes: _containers.RepeatedCompositeFieldContainer[ScopePatch]
    def __init__(self, index: _Optional[int] = ..., attributes: _Optional[_Union[Attributes, _Mapping]] = ..., drop: bool = ..., scopes: _Optional[_Iterable[_Union[ScopePatch, _Mapping]]] = ...) -> None: ...

class ScopePatch(_message.Message):
    __slots__ = ("index", "attributes", "drop", "metrics", "records")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    index: int
    attributes: Attributes
    drop: bool
    metrics: _containers.RepeatedCompositeFieldContainer[MetricPatch]
    records: _containers.RepeatedCompositeFieldContainer[ItemPatch]
    def __init__(self, index: _Optional[int] = ..., attributes: _Optional[_Union[Attributes, _Mapping]] = ..., drop: bool = ..., metrics: _Optional[_Iterable[_Union[MetricPatch, _Mapping]]] = ..., records: _Optional[_Iterable[_Union[ItemPatch, _Mapping]]] = ...) -> None: ...

class MetricPatch(_message.Message):
    __slots__ = ("index", "drop", "points")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    drop: bool
    points: _containers.RepeatedCompositeFieldContainer[ItemPatch]
    def __init__(self, index: _Optional[int] = ..., drop: bool = ..., points: _Optional[_Iterable[_Union[ItemPatch, _Mapping]]] = ...) -> None: ...

class ItemPatch(_message.Message):
    __slots__ = ("index", "attributes", "drop")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    index: int
    attributes: Attributes
    drop: bool
    def __init__(self, index: _Optional[int] = ..., attributes: _Optional[_Union[Attributes, _Mapping]] = ..., drop: bool = ...) -> None: ...

class Attributes(_message.Message):
    __slots__ = ("set", "remove")
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    set: _containers.RepeatedCompositeFieldContainer[KeyValue]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, set: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: AnyValue
    def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AnyValue, _Mapping]] = ...) -> None: ...

class AnyValue(_message.Message):
    __slots__ = ("string_value", "bool_value", "int_value", "double_value", "array_value", "kvlist_value", "bytes_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    ARRAY_VALUE_FIELD_NUMBER: _ClassVar[int]
    KVLIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    bool_value: bool
    int_value: int
    double_value: float
    array_value: ArrayValue
    kvlist_value: KeyValueList
    bytes_value: bytes
    def __init__(self, string_value: _Optional[str] = ..., bool_value: bool = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., array_value: _Optional[_Union[ArrayValue, _Mapping]] = ..., kvlist_value: _Optional[_Union[KeyValueList, _Mapping]] = ..., bytes_value: _Optional[bytes] = ...) -> None: ...

class ArrayValue(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[AnyValue]
    def __init__(self, values: _Optional[_Iterable[_Union[AnyValue, _Mapping]]] = ...) -> None: ...

class KeyValueList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, values: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...
