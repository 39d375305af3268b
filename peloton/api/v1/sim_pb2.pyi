import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FailHostRequest(_message.Message):
    __slots__ = ("hostname", "recover_after")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    RECOVER_AFTER_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    recover_after: _duration_pb2.Duration
    def __init__(self, hostname: _Optional[str] = ..., recover_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class FailHostResponse(_message.Message):
    __slots__ = ("tasks_lost",)
    TASKS_LOST_FIELD_NUMBER: _ClassVar[int]
    tasks_lost: int
    def __init__(self, tasks_lost: _Optional[int] = ...) -> None: ...

class RecoverHostRequest(_message.Message):
    __slots__ = ("hostname",)
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    def __init__(self, hostname: _Optional[str] = ...) -> None: ...

class RecoverHostResponse(_message.Message):
    __slots__ = ("was_down",)
    WAS_DOWN_FIELD_NUMBER: _ClassVar[int]
    was_down: bool
    def __init__(self, was_down: _Optional[bool] = ...) -> None: ...
