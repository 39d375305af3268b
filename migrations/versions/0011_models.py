"""models: stored model documents for the model-aware cost model (`peloton model create NAME -f FILE`)

One row per model: its name, its owner (the principal who created it), the document as canonical JSON text, a
version that each replace increments, and when it was created and last replaced. The table is new: nothing to
convert. The downgrade drops it (the releases before this one have no stored models).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=256), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_models"),
    )


def downgrade() -> None:
    op.drop_table("models")
