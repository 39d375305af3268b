from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuditEvent(_message.Message):
    __slots__ = ("id", "at", "principal", "via", "method", "object", "allowed", "code", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: float
    principal: str
    via: str
    method: str
    object: str
    allowed: bool
    code: str
    message: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[float] = ..., principal: _Optional[str] = ..., via: _Optional[str] = ..., method: _Optional[str] = ..., object: _Optional[str] = ..., allowed: _Optional[bool] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ListAuditEventsRequest(_message.Message):
    __slots__ = ("principal", "object", "since", "until", "denied_only", "limit", "before_id")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    DENIED_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_ID_FIELD_NUMBER: _ClassVar[int]
    principal: str
    object: str
    since: float
    until: float
    denied_only: bool
    limit: int
    before_id: int
    def __init__(self, principal: _Optional[str] = ..., object: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., denied_only: _Optional[bool] = ..., limit: _Optional[int] = ..., before_id: _Optional[int] = ...) -> None: ...

class ListAuditEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ...) -> None: ...
