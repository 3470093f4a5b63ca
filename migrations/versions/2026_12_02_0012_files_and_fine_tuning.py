"""OpenAI-compatible files and fine-tuning jobs (issue 18 item 2): a dataset uploaded as an
OpenAI file keeps its `purpose`; a job created through /v1/fine_tuning/jobs keeps the OpenAI
request it came from (model, files, suffix, seed, method) in `fine_tuning`

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("purpose", sa.String(length=32), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("fine_tuning", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    _drop_column("jobs", "fine_tuning")
    _drop_column("datasets", "purpose")


def _drop_column(table: str, column: str) -> None:
    # In place on SQLite (3.35+): a batch copy of the table fails under the foreign keys that
    # point at it once rows exist (0003 and 0009 do the same).
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    else:
        op.drop_column(table, column)
