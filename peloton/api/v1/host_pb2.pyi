import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from peloton.api.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Host(_message.Message):
    __slots__ = ("hostname", "address", "capacity", "allocated", "labels", "state", "offer_held", "task_ids", "drain", "drain_deadline", "health", "maintenance")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OFFER_HELD_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    MAINTENANCE_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    address: str
    capacity: _job_pb2.Resources
    allocated: _job_pb2.Resources
    labels: _containers.ScalarMap[str, str]
    state: str
    offer_held: bool
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    drain: str
    drain_deadline: float
    health: str
    maintenance: bool
    def __init__(self, hostname: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., allocated: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., state: _Optional[str] = ..., offer_held: _Optional[bool] = ..., task_ids: _Optional[_Iterable[str]] = ..., drain: _Optional[str] = ..., drain_deadline: _Optional[float] = ..., health: _Optional[str] = ..., maintenance: _Optional[bool] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts",)
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[Host]
    def __init__(self, hosts: _Optional[_Iterable[_Union[Host, _Mapping]]] = ...) -> None: ...

class DrainHostRequest(_message.Message):
    __slots__ = ("hostname", "deadline")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    deadline: _duration_pb2.Duration
    def __init__(self, hostname: _Optional[str] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainHostResponse(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: Host
    def __init__(self, host: _Optional[_Union[Host, _Mapping]] = ...) -> None: ...

class UndrainHostRequest(_message.Message):
    __slots__ = ("hostname",)
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    def __init__(self, hostname: _Optional[str] = ...) -> None: ...

class UndrainHostResponse(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: Host
    def __init__(self, host: _Optional[_Union[Host, _Mapping]] = ...) -> None: ...
