"""task_events.span: one row for a run of consecutive tasks that made the same transition together

A gang's members change state together (created, launched, running, ended: the same time, state and, on one host,
the same host), and each of those transitions was one row per member: most of the rows the job manager writes. A row
now stands for the tasks `instance` .. `instance + span` of its job (repo.py writes runs, and reads them back as one
event per task). Every existing row is one task's (span 0, the column's default), so the upgrade rewrites nothing:
adding a column with a constant default is a change of the catalog only, on PostgreSQL (11 and later) and SQLite.

The downgrade writes each run back as one row per task before it drops the column, so a release before this one
reads every event it wrote.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLS = ("job_id", "attempt", "state", "time", "host", "reason", "message", "exit_code")


def upgrade() -> None:
    with op.batch_alter_table("task_events") as batch:
        batch.add_column(sa.Column("span", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    conn = op.get_bind()
    cols = ", ".join(_COLS)
    rows = conn.execute(sa.text(f"SELECT id, instance, span, {cols} FROM task_events WHERE span > 0 ORDER BY id"))
    insert = sa.text(f"INSERT INTO task_events (instance, {cols}) VALUES (:instance, "
                     + ", ".join(f":{c}" for c in _COLS) + ")")
    for r in rows.mappings().all():
        values = {c: r[c] for c in _COLS}
        conn.execute(insert, [{"instance": i, **values} for i in range(r["instance"] + 1, r["instance"] + r["span"] + 1)])
    conn.execute(sa.text("UPDATE task_events SET span = 0 WHERE span > 0"))
    with op.batch_alter_table("task_events") as batch:
        batch.drop_column("span")
