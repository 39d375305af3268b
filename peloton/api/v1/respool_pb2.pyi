from peloton.api.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourcePool(_message.Message):
    __slots__ = ("path", "reservation", "limit", "share", "allocated", "submitters", "allow_root", "reservation_type", "demand", "entitlement", "queued_gangs")
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    SUBMITTERS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ROOT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    ENTITLEMENT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_GANGS_FIELD_NUMBER: _ClassVar[int]
    path: str
    reservation: _job_pb2.Resources
    limit: _job_pb2.Resources
    share: float
    allocated: _job_pb2.Resources
    submitters: _containers.RepeatedScalarFieldContainer[str]
    allow_root: bool
    reservation_type: str
    demand: _job_pb2.Resources
    entitlement: Entitlement
    queued_gangs: int
    def __init__(self, path: _Optional[str] = ..., reservation: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., limit: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., share: _Optional[float] = ..., allocated: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., submitters: _Optional[_Iterable[str]] = ..., allow_root: _Optional[bool] = ..., reservation_type: _Optional[str] = ..., demand: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., entitlement: _Optional[_Union[Entitlement, _Mapping]] = ..., queued_gangs: _Optional[int] = ...) -> None: ...

class Entitlement(_message.Message):
    __slots__ = ("cpu", "mem_mib", "disk_mib", "gpu")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEM_MIB_FIELD_NUMBER: _ClassVar[int]
    DISK_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    cpu: float
    mem_mib: float
    disk_mib: float
    gpu: float
    def __init__(self, cpu: _Optional[float] = ..., mem_mib: _Optional[float] = ..., disk_mib: _Optional[float] = ..., gpu: _Optional[float] = ...) -> None: ...

class CreatePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: ResourcePool
    def __init__(self, pool: _Optional[_Union[ResourcePool, _Mapping]] = ...) -> None: ...

class CreatePoolResponse(_message.Message):
    __slots__ = ("warnings",)
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdatePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: ResourcePool
    def __init__(self, pool: _Optional[_Union[ResourcePool, _Mapping]] = ...) -> None: ...

class UpdatePoolResponse(_message.Message):
    __slots__ = ("warnings",)
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: ResourcePool
    def __init__(self, pool: _Optional[_Union[ResourcePool, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[ResourcePool]
    def __init__(self, pools: _Optional[_Iterable[_Union[ResourcePool, _Mapping]]] = ...) -> None: ...

class QueuedGang(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "pool", "priority", "members", "resources", "enqueued_at", "state", "reason", "position", "preemptible")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    pool: str
    priority: int
    members: int
    resources: _job_pb2.Resources
    enqueued_at: float
    state: str
    reason: str
    position: int
    preemptible: bool
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., pool: _Optional[str] = ..., priority: _Optional[int] = ..., members: _Optional[int] = ..., resources: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., enqueued_at: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., position: _Optional[int] = ..., preemptible: _Optional[bool] = ...) -> None: ...

class ListQueueRequest(_message.Message):
    __slots__ = ("pool", "limit")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    limit: int
    def __init__(self, pool: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListQueueResponse(_message.Message):
    __slots__ = ("gangs", "total")
    GANGS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[QueuedGang]
    total: int
    def __init__(self, gangs: _Optional[_Iterable[_Union[QueuedGang, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class DeletePoolRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class DeletePoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
