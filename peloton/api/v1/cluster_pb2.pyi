from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterInfoResponse(_message.Message):
    __slots__ = ("version", "roles", "store", "backend", "started_at", "addresses", "security", "hosts", "leadership")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_FIELD_NUMBER: _ClassVar[int]
    version: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    store: str
    backend: str
    started_at: float
    addresses: _containers.RepeatedScalarFieldContainer[str]
    security: Security
    hosts: int
    leadership: Leadership
    def __init__(self, version: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., store: _Optional[str] = ..., backend: _Optional[str] = ..., started_at: _Optional[float] = ..., addresses: _Optional[_Iterable[str]] = ..., security: _Optional[_Union[Security, _Mapping]] = ..., hosts: _Optional[int] = ..., leadership: _Optional[_Union[Leadership, _Mapping]] = ...) -> None: ...

class Leadership(_message.Message):
    __slots__ = ("leader", "leader_host", "leader_pid", "leading_since", "epoch", "standbys", "lease_seconds", "roles")
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_HOST_FIELD_NUMBER: _ClassVar[int]
    LEADER_PID_FIELD_NUMBER: _ClassVar[int]
    LEADING_SINCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STANDBYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    leader: str
    leader_host: str
    leader_pid: int
    leading_since: float
    epoch: int
    standbys: _containers.RepeatedCompositeFieldContainer[Standby]
    lease_seconds: float
    roles: _containers.RepeatedCompositeFieldContainer[RoleLeader]
    def __init__(self, leader: _Optional[str] = ..., leader_host: _Optional[str] = ..., leader_pid: _Optional[int] = ..., leading_since: _Optional[float] = ..., epoch: _Optional[int] = ..., standbys: _Optional[_Iterable[_Union[Standby, _Mapping]]] = ..., lease_seconds: _Optional[float] = ..., roles: _Optional[_Iterable[_Union[RoleLeader, _Mapping]]] = ...) -> None: ...

class RoleLeader(_message.Message):
    __slots__ = ("role", "address", "host", "pid", "since", "silent_seconds")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    SILENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    host: str
    pid: int
    since: float
    silent_seconds: float
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., since: _Optional[float] = ..., silent_seconds: _Optional[float] = ...) -> None: ...

class Standby(_message.Message):
    __slots__ = ("address", "waiting_since", "roles")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WAITING_SINCE_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    address: str
    waiting_since: float
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, address: _Optional[str] = ..., waiting_since: _Optional[float] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class Security(_message.Message):
    __slots__ = ("tls", "mutual_tls", "tokens", "insecure", "caller", "caller_roles", "caller_via", "warnings", "task_identities", "uid_range")
    TLS_FIELD_NUMBER: _ClassVar[int]
    MUTUAL_TLS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    CALLER_ROLES_FIELD_NUMBER: _ClassVar[int]
    CALLER_VIA_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    TASK_IDENTITIES_FIELD_NUMBER: _ClassVar[int]
    UID_RANGE_FIELD_NUMBER: _ClassVar[int]
    tls: bool
    mutual_tls: bool
    tokens: bool
    insecure: bool
    caller: str
    caller_roles: _containers.RepeatedScalarFieldContainer[str]
    caller_via: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    task_identities: str
    uid_range: str
    def __init__(self, tls: _Optional[bool] = ..., mutual_tls: _Optional[bool] = ..., tokens: _Optional[bool] = ..., insecure: _Optional[bool] = ..., caller: _Optional[str] = ..., caller_roles: _Optional[_Iterable[str]] = ..., caller_via: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., task_identities: _Optional[str] = ..., uid_range: _Optional[str] = ...) -> None: ...
