"""dataset size in bytes, for the per-tenant storage quota

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 19:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Null for datasets stored before: the quota counts them as empty until deleted.
    op.add_column("datasets", sa.Column("size_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # In place on SQLite (3.35+): a batch copy of `datasets` fails under jobs' foreign keys.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE datasets DROP COLUMN size_bytes")
    else:
        op.drop_column("datasets", "size_bytes")
