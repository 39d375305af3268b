"""initial schema: jobs, gangs, tasks, task_events, resource_pools, meta

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("owner", sa.String(length=256), nullable=False),
        sa.Column("respool", sa.String(length=512), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("desired", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("completed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"], unique=False)
    op.create_index("ix_jobs_owner", "jobs", ["owner"], unique=False)
    op.create_index("ix_jobs_respool", "jobs", ["respool"], unique=False)
    op.create_index("ix_jobs_state", "jobs", ["state"], unique=False)

    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_meta")),
    )

    op.create_table(
        "resource_pools",
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("parent", sa.String(length=512), nullable=True),
        sa.Column("reservation", sa.Text(), nullable=False),
        sa.Column("limit", sa.Text(), nullable=True),
        sa.Column("share", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["parent"], ["resource_pools.path"], name=op.f("fk_resource_pools_parent_resource_pools")
        ),
        sa.PrimaryKeyConstraint("path", name=op.f("pk_resource_pools")),
    )

    op.create_table(
        "gangs",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("instances", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("launch_deadline", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_gangs_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "idx", name=op.f("pk_gangs")),
    )
    op.create_index("ix_gangs_state", "gangs", ["state"], unique=False)

    op.create_table(
        "task_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("instance", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_task_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_events")),
    )
    op.create_index("ix_task_events_job_id_instance", "task_events", ["job_id", "instance"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("instance", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("gang_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
        sa.Column("ports", sa.Text(), nullable=False),
        sa.Column("gpu_ids", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_tasks_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "instance", name=op.f("pk_tasks")),
    )
    op.create_index("ix_tasks_state", "tasks", ["state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_tasks_state", table_name="tasks")
    op.drop_table("tasks")
    op.drop_index("ix_task_events_job_id_instance", table_name="task_events")
    op.drop_table("task_events")
    op.drop_index("ix_gangs_state", table_name="gangs")
    op.drop_table("gangs")
    op.drop_table("resource_pools")
    op.drop_table("meta")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_index("ix_jobs_respool", table_name="jobs")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.drop_index("ix_jobs_created_at", table_name="jobs")
    op.drop_table("jobs")
