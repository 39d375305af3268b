"""audit_events: who did what, when, to which object, allowed or denied

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("principal", sa.String(length=128), nullable=False),
        sa.Column("via", sa.String(length=32), nullable=False),
        sa.Column("method", sa.String(length=128), nullable=False),
        sa.Column("object", sa.String(length=512), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.Column("code", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_index("ix_audit_events_principal", "audit_events", ["principal", "at"])
    op.create_index("ix_audit_events_object", "audit_events", ["object", "at"])


def downgrade() -> None:
    op.drop_table("audit_events")
