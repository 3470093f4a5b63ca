"""Tinker checkpoints can expire (the SDK's ttl_seconds): expires_at, indexed for the expiry pass

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows stored before never expire (null), as a save without ttl_seconds.
    op.add_column(
        "tinker_checkpoints", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        op.f("ix_tinker_checkpoints_expires_at"), "tinker_checkpoints", ["expires_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_tinker_checkpoints_expires_at"), table_name="tinker_checkpoints")
    # In place on SQLite (3.35+), as 0021's downgrade.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE tinker_checkpoints DROP COLUMN expires_at")
    else:
        op.drop_column("tinker_checkpoints", "expires_at")
