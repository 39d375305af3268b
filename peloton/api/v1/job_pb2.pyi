import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Resources(_message.Message):
    __slots__ = ("cpu", "mem", "disk", "gpu", "ports")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    cpu: float
    mem: str
    disk: str
    gpu: int
    ports: int
    def __init__(self, cpu: _Optional[float] = ..., mem: _Optional[str] = ..., disk: _Optional[str] = ..., gpu: _Optional[int] = ..., ports: _Optional[int] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: str
    def __init__(self, image: _Optional[str] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("command", "env", "resources", "container", "env_files", "user")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvFilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    ENV_FILES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    command: str
    env: _containers.ScalarMap[str, str]
    resources: Resources
    container: Container
    env_files: _containers.ScalarMap[str, str]
    user: str
    def __init__(self, command: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ..., env_files: _Optional[_Mapping[str, str]] = ..., user: _Optional[str] = ...) -> None: ...

class GangSpec(_message.Message):
    __slots__ = ("min_available", "on_member_failure", "launch_timeout")
    MIN_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ON_MEMBER_FAILURE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    min_available: int
    on_member_failure: str
    launch_timeout: _duration_pb2.Duration
    def __init__(self, min_available: _Optional[int] = ..., on_member_failure: _Optional[str] = ..., launch_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SlaSpec(_message.Message):
    __slots__ = ("priority", "preemptible", "max_runtime", "preemption_grace")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_GRACE_FIELD_NUMBER: _ClassVar[int]
    priority: int
    preemptible: bool
    max_runtime: _duration_pb2.Duration
    preemption_grace: _duration_pb2.Duration
    def __init__(self, priority: _Optional[int] = ..., preemptible: _Optional[bool] = ..., max_runtime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., preemption_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RetrySpec(_message.Message):
    __slots__ = ("max_attempts",)
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    def __init__(self, max_attempts: _Optional[int] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("attribute", "op", "value")
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    attribute: str
    op: str
    value: str
    def __init__(self, attribute: _Optional[str] = ..., op: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class PlacementSpec(_message.Message):
    __slots__ = ("strategy", "constraints")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    constraints: _containers.RepeatedCompositeFieldContainer[Constraint]
    def __init__(self, strategy: _Optional[str] = ..., constraints: _Optional[_Iterable[_Union[Constraint, _Mapping]]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "owner", "respool", "instances", "gang", "sla", "task", "placement", "retry")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESPOOL_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    GANG_FIELD_NUMBER: _ClassVar[int]
    SLA_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    respool: str
    instances: int
    gang: GangSpec
    sla: SlaSpec
    task: TaskSpec
    placement: PlacementSpec
    retry: RetrySpec
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., respool: _Optional[str] = ..., instances: _Optional[int] = ..., gang: _Optional[_Union[GangSpec, _Mapping]] = ..., sla: _Optional[_Union[SlaSpec, _Mapping]] = ..., task: _Optional[_Union[TaskSpec, _Mapping]] = ..., placement: _Optional[_Union[PlacementSpec, _Mapping]] = ..., retry: _Optional[_Union[RetrySpec, _Mapping]] = ...) -> None: ...

class GangStatus(_message.Message):
    __slots__ = ("index", "instances", "state", "attempt", "reason", "preemptions", "run")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    index: int
    instances: _containers.RepeatedScalarFieldContainer[int]
    state: str
    attempt: int
    reason: str
    preemptions: int
    run: int
    def __init__(self, index: _Optional[int] = ..., instances: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ..., preemptions: _Optional[int] = ..., run: _Optional[int] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("state", "desired_state", "reason", "gangs", "task_states", "created_at", "updated_at", "completed_at", "gang_count", "gang_states", "run_as")
    class TaskStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class GangStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    DESIRED_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GANGS_FIELD_NUMBER: _ClassVar[int]
    TASK_STATES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    GANG_COUNT_FIELD_NUMBER: _ClassVar[int]
    GANG_STATES_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_FIELD_NUMBER: _ClassVar[int]
    state: str
    desired_state: str
    reason: str
    gangs: _containers.RepeatedCompositeFieldContainer[GangStatus]
    task_states: _containers.ScalarMap[str, int]
    created_at: float
    updated_at: float
    completed_at: float
    gang_count: int
    gang_states: _containers.ScalarMap[str, int]
    run_as: str
    def __init__(self, state: _Optional[str] = ..., desired_state: _Optional[str] = ..., reason: _Optional[str] = ..., gangs: _Optional[_Iterable[_Union[GangStatus, _Mapping]]] = ..., task_states: _Optional[_Mapping[str, int]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., completed_at: _Optional[float] = ..., gang_count: _Optional[int] = ..., gang_states: _Optional[_Mapping[str, int]] = ..., run_as: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    status: JobStatus
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., status: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class CreateJobRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("job_id", "warnings")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "owner", "respool", "name_contains", "limit", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESPOOL_FIELD_NUMBER: _ClassVar[int]
    NAME_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[str]
    owner: str
    respool: str
    name_contains: str
    limit: int
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[str]] = ..., owner: _Optional[str] = ..., respool: _Optional[str] = ..., name_contains: _Optional[str] = ..., limit: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StopJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class StopJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("job_ids", "tasks", "stream_id", "after_revision")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    tasks: bool
    stream_id: str
    after_revision: int
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., tasks: _Optional[bool] = ..., stream_id: _Optional[str] = ..., after_revision: _Optional[int] = ...) -> None: ...

class TaskChange(_message.Message):
    __slots__ = ("instance", "task_id", "attempt", "state", "host", "exit_code", "reason", "message")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    instance: int
    task_id: str
    attempt: int
    state: str
    host: str
    exit_code: int
    reason: str
    message: str
    def __init__(self, instance: _Optional[int] = ..., task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[str] = ..., host: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class JobChange(_message.Message):
    __slots__ = ("job_id", "state", "desired_state", "reason", "tasks", "deleted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DESIRED_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    desired_state: str
    reason: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskChange]
    deleted: bool
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ..., desired_state: _Optional[str] = ..., reason: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskChange, _Mapping]]] = ..., deleted: _Optional[bool] = ...) -> None: ...

class WatchJobsResponse(_message.Message):
    __slots__ = ("stream_id", "revision", "changes", "snapshot", "resync")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    revision: int
    changes: _containers.RepeatedCompositeFieldContainer[JobChange]
    snapshot: bool
    resync: bool
    def __init__(self, stream_id: _Optional[str] = ..., revision: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[JobChange, _Mapping]]] = ..., snapshot: _Optional[bool] = ..., resync: _Optional[bool] = ...) -> None: ...
