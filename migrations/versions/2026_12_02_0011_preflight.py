"""pre-flight runs: a job spec sampled and scored on a worker before any job exists

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "preflights",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("memory_estimate", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_preflights_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_preflights")),
    )
    op.create_index(op.f("ix_preflights_tenant_id"), "preflights", ["tenant_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_preflights_tenant_id"), table_name="preflights")
    op.drop_table("preflights")
