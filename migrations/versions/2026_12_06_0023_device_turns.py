"""device turns: when each tenant's work last took a device of each queue

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 03:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "device_turns",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("served_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_device_turns_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", name=op.f("pk_device_turns")),
    )


def downgrade() -> None:
    op.drop_table("device_turns")
