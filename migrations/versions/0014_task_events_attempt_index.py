"""task_events: an index on (job_id, attempt, instance), for one attempt's events

`task logs --attempt N` reads the events of attempt N of one task. Through the (job_id, instance) index that is the
task's whole history (up to retry.max_attempts attempts, each a few events); on this index, only that attempt's.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_task_events_job_id_attempt_instance", "task_events", ["job_id", "attempt", "instance"],
                    unique=False)


def downgrade() -> None:
    op.drop_index("ix_task_events_job_id_attempt_instance", table_name="task_events")
