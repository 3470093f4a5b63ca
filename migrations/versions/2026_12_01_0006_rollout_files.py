"""rollout files: each step's stored completions (Parquet objects) of a job

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 22:31:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_files",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("split", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("object_key", sa.String(length=500), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_rollout_files_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_files")),
        sa.UniqueConstraint("job_id", "split", "step", name="job_split_step"),
    )
    op.create_index(op.f("ix_rollout_files_job_id"), "rollout_files", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_rollout_files_job_id"), table_name="rollout_files")
    op.drop_table("rollout_files")
