"""per-job usage and per-tenant budgets

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("budget_device_hours", sa.Float(), nullable=True))
    op.create_table(
        "job_usage",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("device_kind", sa.String(length=100), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("device_seconds", sa.Float(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=False),
        sa.Column("verifier_cpu_seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_usage_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_job_usage_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("job_id", "day", "device_kind", name=op.f("pk_job_usage")),
    )
    op.create_index("ix_job_usage_tenant_day", "job_usage", ["tenant_id", "day"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_usage_tenant_day", table_name="job_usage")
    op.drop_table("job_usage")
    op.drop_column("tenants", "budget_device_hours")
