"""devices a worker declares and a job asks for (issue 20)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Two added columns with a server default: existing rows read 1 (one device, as before).
    with op.batch_alter_table("worker_heartbeats") as batch:
        batch.add_column(sa.Column("devices", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("devices", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    _drop_column("jobs", "devices")
    _drop_column("worker_heartbeats", "devices")


def _drop_column(table: str, column: str) -> None:
    # In place on SQLite (3.35+): a batch copy of the table fails under the foreign keys that
    # point at it once rows exist (0003 and 0009 do the same).
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    else:
        op.drop_column(table, column)
