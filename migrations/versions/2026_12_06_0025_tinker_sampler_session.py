"""A sampling session names the Tinker session it was made in (issue 46 item 10): a finished
session's sampling sessions take no more requests

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing samplers read None: they are bound to no session, as before.
    with op.batch_alter_table("tinker_sessions") as batch:
        batch.add_column(sa.Column("session_id", sa.String(64), nullable=True))


def downgrade() -> None:
    # In place on SQLite (3.35+), as 0021 does: a batch copy of a table fails under the foreign
    # keys once rows exist.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE tinker_sessions DROP COLUMN session_id")
    else:
        op.drop_column("tinker_sessions", "session_id")
