"""resource_pools.children: how many child pools each pool has, kept in the pool's own row

Jobs go to leaf pools (the root apart), and the batch that commits a new job checks its pool in the same statement,
taking the pool's row FOR KEY SHARE (store/bulk.py). A child created meanwhile is in no snapshot of that statement
(PostgreSQL, READ COMMITTED: a statement that waited for a row lock reads only that row again), so whether a pool
has children must be in its own row: CreatePool, which locks the parent's row, adds 1 to it, DeletePool takes 1
away. The upgrade counts the children every existing pool has.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("resource_pools") as batch:
        batch.add_column(sa.Column("children", sa.Integer(), nullable=False, server_default="0"))
    op.execute("UPDATE resource_pools SET children = (SELECT count(*) FROM resource_pools AS c "
               "WHERE c.parent = resource_pools.path)")


def downgrade() -> None:
    # (on SQLite the batch copies the table: db.downgrade runs it with foreign keys off, as a child pool's row
    # refers to the table being replaced)
    with op.batch_alter_table("resource_pools") as batch:
        batch.drop_column("children")
