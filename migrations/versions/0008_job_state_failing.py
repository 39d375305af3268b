"""jobs.state FAILING: a job that has failed while its last gangs are torn down (it showed PENDING before)

Job states are stored as text, so the schema does not change. The upgrade marks the jobs that are failing now
(RUNNING still desired, a gang ABORTING: only a failure without a retry does that) as FAILING, so the store says the
truth before the daemon's recovery derives it again; the downgrade turns FAILING back into PENDING, a state the
releases before this one can read (they derive it again at start).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sa.text(
        "UPDATE jobs SET state = 'FAILING' WHERE state IN ('PENDING', 'RUNNING') AND desired = 'RUNNING' "
        "AND EXISTS (SELECT 1 FROM gangs WHERE gangs.job_id = jobs.id AND gangs.state = 'ABORTING')"))


def downgrade() -> None:
    op.execute(sa.text("UPDATE jobs SET state = 'PENDING' WHERE state = 'FAILING'"))
