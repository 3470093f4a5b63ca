"""worker heartbeats: the queues live workers serve

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A new table, referenced by none: nothing here copies or alters an existing table.
    op.create_table(
        "worker_heartbeats",
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "queue", name=op.f("pk_worker_heartbeats")),
    )
    op.create_index(
        op.f("ix_worker_heartbeats_queue"), "worker_heartbeats", ["queue"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_worker_heartbeats_queue"), table_name="worker_heartbeats")
    op.drop_table("worker_heartbeats")
