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
    __slots__ = ("instance", "task_id", "resources", "hostname")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    instance: int
    task_id: str
    resources: ResourceVector
    hostname: str
    def __init__(self, instance: _Optional[int] = ..., task_id: _Optional[str] = ..., resources: _Optional[_Union[ResourceVector, _Mapping]] = ..., hostname: _Optional[str] = ...) -> None: ...

class GangRequest(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "members", "priority", "respool", "strategy", "constraints", "enqueued_at", "running", "preemptible", "running_since", "max_runtime_s")
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
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SINCE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
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
    preemptible: bool
    running_since: float
    max_runtime_s: float
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., priority: _Optional[int] = ..., respool: _Optional[str] = ..., strategy: _Optional[str] = ..., constraints: _Optional[_Iterable[_Union[InternalConstraint, _Mapping]]] = ..., enqueued_at: _Optional[float] = ..., running: _Optional[bool] = ..., preemptible: _Optional[bool] = ..., running_since: _Optional[float] = ..., max_runtime_s: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("gang_id", "job_id", "attempt", "members")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    members: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("gang_id", "job_id", "attempt", "reason", "short_hosts", "stale")
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
    STALE_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    job_id: str
    attempt: int
    reason: str
    short_hosts: _containers.ScalarMap[str, int]
    stale: bool
    def __init__(self, gang_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ..., short_hosts: _Optional[_Mapping[str, int]] = ..., stale: _Optional[bool] = ...) -> None: ...

class EnqueueGangsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangRequest]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangRequest, _Mapping]]] = ...) -> None: ...

class EnqueueGangsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DequeueGangsRequest(_message.Message):
    __slots__ = ("max_gangs", "timeout_ms", "capacity", "engine")
    MAX_GANGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    max_gangs: int
    timeout_ms: int
    capacity: ResourceVector
    engine: str
    def __init__(self, max_gangs: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., capacity: _Optional[_Union[ResourceVector, _Mapping]] = ..., engine: _Optional[str] = ...) -> None: ...

class DequeueGangsResponse(_message.Message):
    __slots__ = ("gangs", "release_claims", "probes", "reserving")
    GANGS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    RESERVING_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangRequest]
    release_claims: _containers.RepeatedCompositeFieldContainer[GangKey]
    probes: _containers.RepeatedCompositeFieldContainer[PreemptionProbe]
    reserving: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangRequest, _Mapping]]] = ..., release_claims: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ..., probes: _Optional[_Iterable[_Union[PreemptionProbe, _Mapping]]] = ..., reserving: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class Victim(_message.Message):
    __slots__ = ("gang_id", "attempt", "members", "ends_at")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ENDS_AT_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    members: _containers.RepeatedCompositeFieldContainer[Assignment]
    ends_at: float
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., ends_at: _Optional[float] = ...) -> None: ...

class PreemptionProbe(_message.Message):
    __slots__ = ("gang", "candidates", "need", "ending")
    GANG_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    NEED_FIELD_NUMBER: _ClassVar[int]
    ENDING_FIELD_NUMBER: _ClassVar[int]
    gang: GangRequest
    candidates: _containers.RepeatedCompositeFieldContainer[Victim]
    need: ResourceVector
    ending: _containers.RepeatedCompositeFieldContainer[Victim]
    def __init__(self, gang: _Optional[_Union[GangRequest, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[Victim, _Mapping]]] = ..., need: _Optional[_Union[ResourceVector, _Mapping]] = ..., ending: _Optional[_Iterable[_Union[Victim, _Mapping]]] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("gang", "hosts", "expected_start")
    GANG_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_START_FIELD_NUMBER: _ClassVar[int]
    gang: GangKey
    hosts: _containers.RepeatedScalarFieldContainer[str]
    expected_start: float
    def __init__(self, gang: _Optional[_Union[GangKey, _Mapping]] = ..., hosts: _Optional[_Iterable[str]] = ..., expected_start: _Optional[float] = ...) -> None: ...

class Preemption(_message.Message):
    __slots__ = ("gang", "victims")
    GANG_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    gang: GangKey
    victims: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, gang: _Optional[_Union[GangKey, _Mapping]] = ..., victims: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class SetPlacementsRequest(_message.Message):
    __slots__ = ("placements", "failures", "preemptions", "reservations", "engine")
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    failures: _containers.RepeatedCompositeFieldContainer[Failure]
    preemptions: _containers.RepeatedCompositeFieldContainer[Preemption]
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    engine: str
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ..., preemptions: _Optional[_Iterable[_Union[Preemption, _Mapping]]] = ..., reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ..., engine: _Optional[str] = ...) -> None: ...

class SetPlacementsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlacementsRequest(_message.Message):
    __slots__ = ("max", "timeout_ms", "consumer")
    MAX_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    max: int
    timeout_ms: int
    consumer: str
    def __init__(self, max: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., consumer: _Optional[str] = ...) -> None: ...

class GetPlacementsResponse(_message.Message):
    __slots__ = ("placements", "pending", "preempt", "incarnation")
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    pending: _containers.RepeatedCompositeFieldContainer[Failure]
    preempt: _containers.RepeatedCompositeFieldContainer[PreemptGang]
    incarnation: str
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ..., preempt: _Optional[_Iterable[_Union[PreemptGang, _Mapping]]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class PreemptGang(_message.Message):
    __slots__ = ("gang_id", "attempt", "reason")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    reason: str
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class GangKey(_message.Message):
    __slots__ = ("gang_id", "attempt")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class AckPlacementsRequest(_message.Message):
    __slots__ = ("done", "retry")
    DONE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    done: _containers.RepeatedCompositeFieldContainer[GangKey]
    retry: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, done: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ..., retry: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class AckPlacementsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckGangsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class CheckGangsResponse(_message.Message):
    __slots__ = ("unknown",)
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    unknown: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, unknown: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

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

class SyncHostsRequest(_message.Message):
    __slots__ = ("since_version", "stream_id")
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    since_version: int
    stream_id: str
    def __init__(self, since_version: _Optional[int] = ..., stream_id: _Optional[str] = ...) -> None: ...

class SyncHostsResponse(_message.Message):
    __slots__ = ("stream_id", "version", "full", "hosts", "removed")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    version: int
    full: bool
    hosts: _containers.RepeatedCompositeFieldContainer[HostOffer]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream_id: _Optional[str] = ..., version: _Optional[int] = ..., full: _Optional[bool] = ..., hosts: _Optional[_Iterable[_Union[HostOffer, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ClaimPlacementsRequest(_message.Message):
    __slots__ = ("placements",)
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class ClaimPlacementsResponse(_message.Message):
    __slots__ = ("claimed", "refused")
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    claimed: _containers.RepeatedCompositeFieldContainer[Placement]
    refused: _containers.RepeatedCompositeFieldContainer[Failure]
    def __init__(self, claimed: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ...) -> None: ...

class ReleaseClaimsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangKey]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangKey, _Mapping]]] = ...) -> None: ...

class ReleaseClaimsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterCapacityRequest(_message.Message):
    __slots__ = ("if_version",)
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    if_version: int
    def __init__(self, if_version: _Optional[int] = ...) -> None: ...

class ClusterCapacityResponse(_message.Message):
    __slots__ = ("hosts", "version", "unchanged")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostOffer]
    version: int
    unchanged: bool
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostOffer, _Mapping]]] = ..., version: _Optional[int] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class LaunchTask(_message.Message):
    __slots__ = ("task_id", "job_id", "instance", "attempt", "hostname", "command", "env", "resources", "gpu_ids", "ports", "files", "container_image", "user", "legacy_user")
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
    USER_FIELD_NUMBER: _ClassVar[int]
    LEGACY_USER_FIELD_NUMBER: _ClassVar[int]
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
    user: str
    legacy_user: bool
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., instance: _Optional[int] = ..., attempt: _Optional[int] = ..., hostname: _Optional[str] = ..., command: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., ports: _Optional[_Iterable[int]] = ..., files: _Optional[_Mapping[str, str]] = ..., container_image: _Optional[str] = ..., user: _Optional[str] = ..., legacy_user: _Optional[bool] = ...) -> None: ...

class GangLaunch(_message.Message):
    __slots__ = ("gang_id", "attempt", "tasks")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    tasks: _containers.RepeatedCompositeFieldContainer[LaunchTask]
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[LaunchTask, _Mapping]]] = ...) -> None: ...

class LaunchGangsRequest(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[GangLaunch]
    def __init__(self, gangs: _Optional[_Iterable[_Union[GangLaunch, _Mapping]]] = ...) -> None: ...

class LaunchResult(_message.Message):
    __slots__ = ("gang_id", "attempt", "outcome", "task_id", "message", "permanent")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    attempt: int
    outcome: str
    task_id: str
    message: str
    permanent: bool
    def __init__(self, gang_id: _Optional[str] = ..., attempt: _Optional[int] = ..., outcome: _Optional[str] = ..., task_id: _Optional[str] = ..., message: _Optional[str] = ..., permanent: _Optional[bool] = ...) -> None: ...

class LaunchGangsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LaunchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[LaunchResult, _Mapping]]] = ...) -> None: ...

class KillTasksRequest(_message.Message):
    __slots__ = ("task_ids", "grace_s")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    grace_s: float
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., grace_s: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("events", "stream_id", "gap")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskStatusEvent]
    stream_id: str
    gap: bool
    def __init__(self, events: _Optional[_Iterable[_Union[TaskStatusEvent, _Mapping]]] = ..., stream_id: _Optional[str] = ..., gap: _Optional[bool] = ...) -> None: ...

class ReconcileTasksRequest(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

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

class ListRunningTasksRequest(_message.Message):
    __slots__ = ("page_token", "page_size")
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    page_token: str
    page_size: int
    def __init__(self, page_token: _Optional[str] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListRunningTasksResponse(_message.Message):
    __slots__ = ("task_ids", "next_page_token")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReadTaskLogRequest(_message.Message):
    __slots__ = ("task_id", "stream", "offset", "max_bytes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    stream: str
    offset: int
    max_bytes: int
    def __init__(self, task_id: _Optional[str] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadTaskLogResponse(_message.Message):
    __slots__ = ("content", "next_offset")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    next_offset: int
    def __init__(self, content: _Optional[bytes] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ListDrainsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDrainsResponse(_message.Message):
    __slots__ = ("drains",)
    class DrainsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DRAINS_FIELD_NUMBER: _ClassVar[int]
    drains: _containers.ScalarMap[str, float]
    def __init__(self, drains: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RemoveSandboxesRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveSandboxesResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...
