"""paused jobs and forked jobs

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The new statuses (`pausing`, `paused`) fit the existing String(16) column: nothing to do
    # for them. A fork's lineage: {job_id, step, checkpoint_id} of the checkpoint it starts from.
    op.add_column("jobs", sa.Column("forked_from", sa.JSON(), nullable=True))


def downgrade() -> None:
    # A paused job has no status the older code knows: it goes back to `queued` (it resumes
    # from its last checkpoint), a pausing one to `running` (its lease still holds it).
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'paused'")
    op.execute("UPDATE jobs SET status = 'running' WHERE status = 'pausing'")
    if op.get_bind().dialect.name == "sqlite":  # in place (3.35+): no batch copy of `jobs`
        op.execute("ALTER TABLE jobs DROP COLUMN forked_from")
    else:
        op.drop_column("jobs", "forked_from")
