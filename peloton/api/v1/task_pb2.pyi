from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskEvent(_message.Message):
    __slots__ = ("attempt", "state", "time", "host", "reason", "message", "exit_code")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    state: str
    time: float
    host: str
    reason: str
    message: str
    exit_code: int
    def __init__(self, attempt: _Optional[int] = ..., state: _Optional[str] = ..., time: _Optional[float] = ..., host: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("job_id", "instance", "task_id", "attempt", "gang_index", "state", "host", "address", "ports", "gpus", "exit_code", "reason", "message", "started_at", "finished_at", "events")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GANG_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    instance: int
    task_id: str
    attempt: int
    gang_index: int
    state: str
    host: str
    address: str
    ports: _containers.RepeatedScalarFieldContainer[int]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    exit_code: int
    reason: str
    message: str
    started_at: float
    finished_at: float
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    def __init__(self, job_id: _Optional[str] = ..., instance: _Optional[int] = ..., task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., gang_index: _Optional[int] = ..., state: _Optional[str] = ..., host: _Optional[str] = ..., address: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ..., gpus: _Optional[_Iterable[int]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("job_id", "instance")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    instance: int
    def __init__(self, job_id: _Optional[str] = ..., instance: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class GetTaskLogsRequest(_message.Message):
    __slots__ = ("job_id", "instance", "attempt", "stream", "tail_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    instance: int
    attempt: int
    stream: str
    tail_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., instance: _Optional[int] = ..., attempt: _Optional[int] = ..., stream: _Optional[str] = ..., tail_bytes: _Optional[int] = ...) -> None: ...

class GetTaskLogsResponse(_message.Message):
    __slots__ = ("task_id", "content")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    content: bytes
    def __init__(self, task_id: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...
