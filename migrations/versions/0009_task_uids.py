"""task_uids: the uid allocated to each principal whose tasks have no Unix user mapped (one identity per tenant)

A principal's tasks run as the Unix user the principals file maps it to or, where none is, as a uid of
--task-uid-range allocated to it at its first job and kept for it (peloton/security/run_as.py). The table is new: nothing
to convert. The downgrade drops it; the releases before this one run every task of a principal naming no user as
--default-task-user.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_uids",
        sa.Column("principal", sa.String(length=128), nullable=False),
        sa.Column("uid", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("principal", name="pk_task_uids"),
        sa.UniqueConstraint("uid", name="uq_task_uids_uid"),
    )


def downgrade() -> None:
    op.drop_table("task_uids")
