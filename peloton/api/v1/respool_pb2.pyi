from peloton.api.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourcePool(_message.Message):
    __slots__ = ("path", "reservation", "limit", "share", "allocated", "submitters", "allow_root")
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    SUBMITTERS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ROOT_FIELD_NUMBER: _ClassVar[int]
    path: str
    reservation: _job_pb2.Resources
    limit: _job_pb2.Resources
    share: float
    allocated: _job_pb2.Resources
    submitters: _containers.RepeatedScalarFieldContainer[str]
    allow_root: bool
    def __init__(self, path: _Optional[str] = ..., reservation: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., limit: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., share: _Optional[float] = ..., allocated: _Optional[_Union[_job_pb2.Resources, _Mapping]] = ..., submitters: _Optional[_Iterable[str]] = ..., allow_root: _Optional[bool] = ...) -> None: ...

class CreatePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: ResourcePool
    def __init__(self, pool: _Optional[_Union[ResourcePool, _Mapping]] = ...) -> None: ...

class CreatePoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

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

class DeletePoolRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class DeletePoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
