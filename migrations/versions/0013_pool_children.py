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
    sqlite = op.get_bind().dialect.name == "sqlite"
    parents: list[dict[str, str]] = []
    if sqlite:
        # the batch copies the rows into a new table whose `parent` refers to the old one, then drops the old one:
        # a child pool's row would fail that drop (its foreign key checked at once, or, deferred, still counted as
        # broken at the commit). So no row refers to another while the table is copied, then each gets its parent back
        parents = [dict(r) for r in op.get_bind().execute(
            sa.text("SELECT path, parent FROM resource_pools WHERE parent IS NOT NULL")).mappings()]
        op.execute("UPDATE resource_pools SET parent = NULL")
    with op.batch_alter_table("resource_pools") as batch:
        batch.drop_column("children")
    if parents:
        op.get_bind().execute(sa.text("UPDATE resource_pools SET parent = :parent WHERE path = :path"), parents)
