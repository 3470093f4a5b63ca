"""pre-flights under a lease, as evaluations: epoch, attempts, lease_until, enqueued_at

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("enqueued_at", "lease_until", "attempts", "epoch")


def upgrade() -> None:
    op.add_column(
        "preflights", sa.Column("epoch", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "preflights", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("preflights", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
    # Rows stored before were enqueued when created; null for none of them.
    op.add_column("preflights", sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE preflights SET enqueued_at = created_at")


def downgrade() -> None:
    for column in COLUMNS:
        # In place on SQLite (3.35+), as 0003's downgrade.
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE preflights DROP COLUMN {column}")
        else:
            op.drop_column("preflights", column)
