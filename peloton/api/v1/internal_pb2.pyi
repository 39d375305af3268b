from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourceVector(_message.Message):
    __slots__ = ("cpu", "mem_mib", "disk_mib", "gpu", "ports")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEM_MIB_FIELD_NUMBER: _ClassVar[int]
    DISK_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    cpu: float
    mem_mib: float
    disk_mib: float
    gpu: int
    ports: int
    def __init__(self, cpu: _Optional[float] = ..., mem_mib: _Optional[float] = ..., disk_mib: _Optional[float] = ..., gpu: _Optional[int] = ..., ports: _Optional[int] = ...) -> None: ...

class InternalConstraint(_message.Message):
    __slots__ = ("attribute", "op", "value")
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    attribute: str
    op: str
    value: str
    def __init__(self, attribute: _Optional[str] = ..., op: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("instance", "task_id", "resources")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    instance: int
    task_id: str
    resources: ResourceVector
    def __init__(self, instance: _Optional[int] = ..., task_id: _Optional[str] = ..., resources: _Optional[_Union[ResourceVector, _Mapping]] = ...) -> None: ...

class GangRequest(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "members", "priority", "respool", "strategy", "constraints", "enqueued_at", "running")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RESPOOL_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    priority: int
    respool: str
    strategy: str
    constraints: _containers.RepeatedCompositeFieldContainer[InternalConstraint]
    enqueued_at: float
    running: bool
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., priority: _Optional[int] = ..., respool: _Optional[str] = ..., strategy: _Optional[str] = ..., constraints: _Optional[_Iterable[_Union[InternalConstraint, _Mapping]]] = ..., enqueued_at: _Optional[float] = ..., running: _Optional[bool] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("instance", "task_id", "hostname", "address", "resources", "gpu_ids", "ports")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    instance: int
    task_id: str
    hostname: str
    address: str
    resources: ResourceVector
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, instance: _Optional[int] = ..., task_id: _Optional[str] = ..., hostname: _Optional[str] = ..., address: _Optional[str] = ..., resources: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., ports: _Optional[_Iterable[int]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "lease_id", "members")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    lease_id: str
    members: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., lease_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "reason", "short_hosts")
    class ShortHostsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHORT_HOSTS_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    reason: str
    short_hosts: _containers.ScalarMap[str, int]
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ..., short_hosts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class EnqueueGangsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangRequest]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangRequest, _Mapping]]] = ...) -> None: ...

class EnqueueGangsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DequeueGangsRequest(_message.Message):
    __slots__ = ("max_gangs", "timeout_ms")
    MAX_GANGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    max_gangs: int
    timeout_ms: int
    def __init__(self, max_gangs: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DequeueGangsResponse(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangRequest]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangRequest, _Mapping]]] = ...) -> None: ...

class SetPlacementsRequest(_message.Message):
    __slots__ = ("placements", "failures")
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    failures: _containers.RepeatedCompositeFieldContainer[Failure]
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ...) -> None: ...

class SetPlacementsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlacementsRequest(_message.Message):
    __slots__ = ("max", "timeout_ms")
    MAX_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    max: int
    timeout_ms: int
    def __init__(self, max: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class GetPlacementsResponse(_message.Message):
    __slots__ = ("placements", "pending")
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    pending: _containers.RepeatedCompositeFieldContainer[Failure]
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ...) -> None: ...

class GangKey(_message.Message):
    __slots__ = ("gang_id", "attempt")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class RemoveGangsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class RemoveGangsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolUsage(_message.Message):
    __slots__ = ("path", "allocated", "queued_gangs")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_GANGS_FIELD_NUMBER: _ClassVar[int]
    path: str
    allocated: ResourceVector
    queued_gangs: int
    def __init__(self, path: _Optional[str] = ..., allocated: _Optional[_Union[ResourceVector, _Mapping]] = ..., queued_gangs: _Optional[int] = ...) -> None: ...

class GetPoolUsageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPoolUsageResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolUsage]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolUsage, _Mapping]]] = ...) -> None: ...

class HostOffer(_message.Message):
    __slots__ = ("hostname", "address", "free", "gpu_ids", "ports", "labels", "capacity", "has_gpus")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HAS_GPUS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    address: str
    free: ResourceVector
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    ports: _containers.RepeatedScalarFieldContainer[int]
    labels: _containers.ScalarMap[str, str]
    capacity: ResourceVector
    has_gpus: bool
    def __init__(self, hostname: _Optional[str] = ..., address: _Optional[str] = ..., free: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., ports: _Optional[_Iterable[int]] = ..., labels: _Optional[_Mapping[str, str]] = ..., capacity: _Optional[_Union[ResourceVector, _Mapping]] = ..., has_gpus: _Optional[bool] = ...) -> None: ...

class AcquireHostOffersRequest(_message.Message):
    __slots__ = ("lease_seconds",)
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_seconds: int
    def __init__(self, lease_seconds: _Optional[int] = ...) -> None: ...

class AcquireHostOffersResponse(_message.Message):
    __slots__ = ("lease_id", "offers")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    offers: _containers.RepeatedCompositeFieldContainer[HostOffer]
    def __init__(self, lease_id: _Optional[str] = ..., offers: _Optional[_Iterable[_Union[HostOffer, _Mapping]]] = ...) -> None: ...

class ReleaseHostOffersRequest(_message.Message):
    __slots__ = ("lease_id", "keep")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    keep: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, lease_id: _Optional[str] = ..., keep: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class ReleaseHostOffersResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterCapacityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterCapacityResponse(_message.Message):
    __slots__ = ("hosts",)
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostOffer]
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostOffer, _Mapping]]] = ...) -> None: ...

class LaunchTask(_message.Message):
    __slots__ = ("task_id", "job_id", "instance", "attempt", "hostname", "command", "env", "resources", "gpu_ids", "ports", "files", "container_image")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    instance: int
    attempt: int
    hostname: str
    command: str
    env: _containers.ScalarMap[str, str]
    resources: ResourceVector
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    ports: _containers.RepeatedScalarFieldContainer[int]
    files: _containers.ScalarMap[str, str]
    container_image: str
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., instance: _Optional[int] = ..., attempt: _Optional[int] = ..., hostname: _Optional[str] = ..., command: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., ports: _Optional[_Iterable[int]] = ..., files: _Optional[_Mapping[str, str]] = ..., container_image: _Optional[str] = ...) -> None: ...

class LaunchGangRequest(_message.Message):
    __slots__ = ("lease_id", "tasks")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[LaunchTask]
    def __init__(self, lease_id: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[LaunchTask, _Mapping]]] = ...) -> None: ...

class LaunchGangResponse(_message.Message):
    __slots__ = ("ok", "failed_task_id", "message")
    OK_FIELD_NUMBER: _ClassVar[int]
    FAILED_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    failed_task_id: str
    message: str
    def __init__(self, ok: _Optional[bool] = ..., failed_task_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class KillTasksRequest(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class KillTasksResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TaskStatusEvent(_message.Message):
    __slots__ = ("seq", "task_id", "state", "time", "hostname", "exit_code", "reason", "message", "permanent")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    task_id: str
    state: str
    time: float
    hostname: str
    exit_code: int
    reason: str
    message: str
    permanent: bool
    def __init__(self, seq: _Optional[int] = ..., task_id: _Optional[str] = ..., state: _Optional[str] = ..., time: _Optional[float] = ..., hostname: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., permanent: _Optional[bool] = ...) -> None: ...

class WaitTaskEventsRequest(_message.Message):
    __slots__ = ("after_seq", "max_events", "timeout_ms")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    max_events: int
    timeout_ms: int
    def __init__(self, after_seq: _Optional[int] = ..., max_events: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WaitTaskEventsResponse(_message.Message):
    __slots__ = ("events", "stream_id")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskStatusEvent]
    stream_id: str
    def __init__(self, events: _Optional[_Iterable[_Union[TaskStatusEvent, _Mapping]]] = ..., stream_id: _Optional[str] = ...) -> None: ...

class ReconcileTasksRequest(_message.Message):
    __slots__ = ("task_ids", "kill_unknown")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    KILL_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    kill_unknown: bool
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., kill_unknown: _Optional[bool] = ...) -> None: ...

class ReconcileTasksResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[TaskStatusEvent]
    def __init__(self, statuses: _Optional[_Iterable[_Union[TaskStatusEvent, _Mapping]]] = ...) -> None: ...

class AckTaskEventsRequest(_message.Message):
    __slots__ = ("up_to_seq",)
    UP_TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    up_to_seq: int
    def __init__(self, up_to_seq: _Optional[int] = ...) -> None: ...

class AckTaskEventsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadTaskLogRequest(_message.Message):
    __slots__ = ("task_id", "stream", "tail_bytes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    stream: str
    tail_bytes: int
    def __init__(self, task_id: _Optional[str] = ..., stream: _Optional[str] = ..., tail_bytes: _Optional[int] = ...) -> None: ...

class ReadTaskLogResponse(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    def __init__(self, content: _Optional[bytes] = ...) -> None: ...
