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
    __slots__ = ("job_id", "instance", "task_id", "attempt", "gang_index", "state", "host", "address", "ports", "gpus", "exit_code", "reason", "message", "started_at", "finished_at", "events", "events_total")
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
    EVENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
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
    events_total: int
    def __init__(self, job_id: _Optional[str] = ..., instance: _Optional[int] = ..., task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., gang_index: _Optional[int] = ..., state: _Optional[str] = ..., host: _Optional[str] = ..., address: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ..., gpus: _Optional[_Iterable[int]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ..., events_total: _Optional[int] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "page_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("job_id", "instance", "attempt", "stream", "tail_bytes", "offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    instance: int
    attempt: int
    stream: str
    tail_bytes: int
    offset: int
    def __init__(self, job_id: _Optional[str] = ..., instance: _Optional[int] = ..., attempt: _Optional[int] = ..., stream: _Optional[str] = ..., tail_bytes: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class GetTaskLogsResponse(_message.Message):
    __slots__ = ("task_id", "content", "next_offset", "task_state")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TASK_STATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    content: bytes
    next_offset: int
    task_state: str
    def __init__(self, task_id: _Optional[str] = ..., content: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., task_state: _Optional[str] = ...) -> None: ...
