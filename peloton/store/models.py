"""ORM rows. Private to peloton/store: repo.py converts them to and from domain records.

JSON-ish columns (spec, instances, ports, gpu_ids, reservation, limit) hold `json.dumps` text in a plain
Text column, so SQLite and PostgreSQL behave byte-for-byte the same. Times are epoch seconds (float64).
Every schema change needs a new migration in migrations/versions/ (a test compares the two).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Double, ForeignKey, Index, Integer, MetaData, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    owner: Mapped[str] = mapped_column(String(256), nullable=False)
    respool: Mapped[str] = mapped_column(String(512), nullable=False)
    spec: Mapped[str] = mapped_column(Text, nullable=False)  # json.dumps(spec_to_dict(spec))
    state: Mapped[str] = mapped_column(String(32), nullable=False)
    desired: Mapped[str] = mapped_column(String(32), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[float] = mapped_column(Double, nullable=False)
    updated_at: Mapped[float] = mapped_column(Double, nullable=False)
    completed_at: Mapped[float] = mapped_column(Double, nullable=False)
    # the caller's idempotency key for CreateJob: a retry with the same key returns the same job
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)

    __table_args__ = (
        Index("ix_jobs_request_id", "request_id", unique=True),
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_owner", "owner"),
        Index("ix_jobs_respool", "respool"),
        Index("ix_jobs_created_at", "created_at"),
    )


class GangRow(Base):
    __tablename__ = "gangs"

    job_id: Mapped[str] = mapped_column(String(128), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    instances: Mapped[str] = mapped_column(Text, nullable=False)  # JSON list of ints
    state: Mapped[str] = mapped_column(String(32), nullable=False)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    launch_deadline: Mapped[float] = mapped_column(Double, nullable=False)
    updated_at: Mapped[float] = mapped_column(Double, nullable=False)
    preemptions: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    plan: Mapped[str] = mapped_column(Text, nullable=False, server_default="")  # JSON: a model-aware run's plan

    __table_args__ = (Index("ix_gangs_state", "state"),)


class TaskRow(Base):
    __tablename__ = "tasks"

    job_id: Mapped[str] = mapped_column(String(128), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    instance: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    gang_index: Mapped[int] = mapped_column(Integer, nullable=False)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(String(32), nullable=False)
    host: Mapped[str] = mapped_column(String(256), nullable=False)
    address: Mapped[str] = mapped_column(String(256), nullable=False)
    ports: Mapped[str] = mapped_column(Text, nullable=False)  # JSON list of ints
    gpu_ids: Mapped[str] = mapped_column(Text, nullable=False)  # JSON list of ints
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    started_at: Mapped[float] = mapped_column(Double, nullable=False)
    finished_at: Mapped[float] = mapped_column(Double, nullable=False)
    updated_at: Mapped[float] = mapped_column(Double, nullable=False)

    __table_args__ = (Index("ix_tasks_state", "state"),)


class TaskEventRow(Base):
    """One transition of the tasks `instance` .. `instance + span` of a job, which made it together with the same
    attempt, state, time, host, reason, message and exit code (a gang's members, as a rule: one row where there
    were one per member). repo.py writes and reads them; the API sees one event per task."""

    __tablename__ = "task_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(128), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    instance: Mapped[int] = mapped_column(Integer, nullable=False)
    span: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")  # at most repo.EVENT_SPAN_MAX
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(String(32), nullable=False)
    time: Mapped[float] = mapped_column(Double, nullable=False)
    host: Mapped[str] = mapped_column(String(256), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (Index("ix_task_events_job_id_instance", "job_id", "instance"),)


class ResourcePoolRow(Base):
    __tablename__ = "resource_pools"

    path: Mapped[str] = mapped_column(String(512), primary_key=True)
    parent: Mapped[str | None] = mapped_column(String(512), ForeignKey("resource_pools.path"), nullable=True)
    reservation: Mapped[str] = mapped_column(Text, nullable=False)  # JSON object of a Resources
    limit_: Mapped[str | None] = mapped_column("limit", Text, nullable=True)  # JSON object, NULL = no limit
    share: Mapped[float] = mapped_column(Double, nullable=False)
    created_at: Mapped[float] = mapped_column(Double, nullable=False)
    submitters: Mapped[str] = mapped_column(Text, nullable=False, server_default="[]")  # JSON list of principals
    allow_root: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    reservation_type: Mapped[str] = mapped_column(String(16), nullable=False, server_default="elastic")
    # how many child pools it has (repo.create_pool, repo.delete_pool): a new job's pool must have none, and the
    # batch that commits the job reads it in the pool's own row, the row it locks (bulk.write_batch)
    children: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")


class MetaRow(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


class AuditEventRow(Base):
    """Who did what, when, to which object, and whether it was allowed (identity.py, api/audit.py)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double, nullable=False)
    principal: Mapped[str] = mapped_column(String(128), nullable=False)
    via: Mapped[str] = mapped_column(String(32), nullable=False)
    method: Mapped[str] = mapped_column(String(128), nullable=False)
    object: Mapped[str] = mapped_column(String(512), nullable=False)
    allowed: Mapped[bool] = mapped_column(Boolean, nullable=False)
    code: Mapped[str] = mapped_column(String(32), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)

    __table_args__ = (Index("ix_audit_events_at", "at"), Index("ix_audit_events_principal", "principal", "at"),
                      Index("ix_audit_events_object", "object", "at"))


class TaskUidRow(Base):
    """The uid allocated to a principal whose tasks have no Unix user mapped (run_as.py): one per principal, one
    principal per uid, never reused."""

    __tablename__ = "task_uids"

    principal: Mapped[str] = mapped_column(String(128), primary_key=True)
    uid: Mapped[int] = mapped_column(Integer, nullable=False, unique=True)
    created_at: Mapped[float] = mapped_column(Double, nullable=False)


class ModelRow(Base):
    """A stored model document (`peloton model create`; domain/stored_models.py): the canonical JSON text the daemon
    read, who created it, and how many times it was replaced."""

    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(256), nullable=False)
    document: Mapped[str] = mapped_column(Text, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[float] = mapped_column(Double, nullable=False)
    updated_at: Mapped[float] = mapped_column(Double, nullable=False)
