"""resource_pools.reservation_type: elastic (unused reservation is lent) or static (held even when idle)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("resource_pools") as batch:
        batch.add_column(sa.Column("reservation_type", sa.String(16), nullable=False, server_default="elastic"))


def downgrade() -> None:
    with op.batch_alter_table("resource_pools") as batch:
        batch.drop_column("reservation_type")
