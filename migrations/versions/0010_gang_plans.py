"""gangs.plan: a model-aware gang's plan for its current run (JSON; "" for any other gang)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gangs") as batch:
        batch.add_column(sa.Column("plan", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("gangs") as batch:
        batch.drop_column("plan")
