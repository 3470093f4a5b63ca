"""Tinker requests are leased as jobs are (issue 46 item 5): epoch and lease_until

Revision ID: 0021
Revises: 0019
Create Date: 2026-12-06 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rows read epoch 0 and no lease: a request still `running` then (claimed by a
    # worker of before this revision) counts as lapsed, and the next pass fails it.
    with op.batch_alter_table("tinker_requests") as batch:
        batch.add_column(sa.Column("epoch", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for column in ("lease_until", "epoch"):
        # In place on SQLite (3.35+), as 0014 does: a batch copy of a table fails under the
        # foreign keys once rows exist.
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE tinker_requests DROP COLUMN {column}")
        else:
            op.drop_column("tinker_requests", column)
