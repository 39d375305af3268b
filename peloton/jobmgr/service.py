"""gRPC servicers of the job manager: the public JobService and TaskService. Thin: convert, call, convert."""

from __future__ import annotations

from peloton.api import convert
from peloton.api.status import grpc_errors
from peloton.api.v1 import job_pb2, job_pb2_grpc, task_pb2, task_pb2_grpc
from peloton.errors import InvalidArgument
from peloton.jobmgr.manager import JobManager

DEFAULT_LOG_TAIL = 1024 * 1024


def _job_id(value: str) -> str:
    if not value:
        raise InvalidArgument("job_id: must not be empty", field="job_id")
    return value


class JobServicer(job_pb2_grpc.JobServiceServicer):
    def __init__(self, jm: JobManager) -> None:
        self.jm = jm

    @grpc_errors
    def CreateJob(self, request, context):  # type: ignore[no-untyped-def]
        if not request.HasField("spec"):
            raise InvalidArgument("spec: required", field="spec")
        job_id = self.jm.create_job(convert.spec_from_proto(request.spec))
        return job_pb2.CreateJobResponse(job_id=job_id)

    @grpc_errors
    def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        job, gangs, counts = self.jm.get_job(_job_id(request.job_id))
        return job_pb2.GetJobResponse(job=convert.job_to_proto(job, gangs, counts))

    @grpc_errors
    def ListJobs(self, request, context):  # type: ignore[no-untyped-def]
        if request.limit < 0:
            raise InvalidArgument("limit: must not be negative", field="limit")
        rows = self.jm.list_jobs(list(request.states), request.owner, request.respool, request.name_contains,
                                 request.limit)
        return job_pb2.ListJobsResponse(jobs=[convert.job_to_proto(j, g, c) for j, g, c in rows])

    @grpc_errors
    def StopJob(self, request, context):  # type: ignore[no-untyped-def]
        self.jm.stop_job(_job_id(request.job_id))
        return job_pb2.StopJobResponse()

    @grpc_errors
    def DeleteJob(self, request, context):  # type: ignore[no-untyped-def]
        self.jm.delete_job(_job_id(request.job_id))
        return job_pb2.DeleteJobResponse()


class TaskServicer(task_pb2_grpc.TaskServiceServicer):
    def __init__(self, jm: JobManager) -> None:
        self.jm = jm

    @grpc_errors
    def ListTasks(self, request, context):  # type: ignore[no-untyped-def]
        return task_pb2.ListTasksResponse(tasks=[convert.task_to_proto(t) for t in self.jm.list_tasks(_job_id(request.job_id))])

    @grpc_errors
    def GetTask(self, request, context):  # type: ignore[no-untyped-def]
        task, events = self.jm.get_task(_job_id(request.job_id), request.instance)
        return task_pb2.GetTaskResponse(task=convert.task_to_proto(task, events))

    @grpc_errors
    def GetTaskLogs(self, request, context):  # type: ignore[no-untyped-def]
        if request.tail_bytes < 0:
            raise InvalidArgument("tail_bytes: must not be negative", field="tail_bytes")
        task_id, content = self.jm.task_log(_job_id(request.job_id), request.instance, request.attempt,
                                            request.stream, request.tail_bytes or DEFAULT_LOG_TAIL)
        return task_pb2.GetTaskLogsResponse(task_id=task_id, content=content)
