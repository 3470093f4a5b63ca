"""jobs indexed by (tenant, status): the open-jobs count reads live jobs only (issue 21)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 19:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every submission counts its tenant's live jobs under the tenant's lock: by tenant alone,
    # that count read the tenant's whole history of jobs. The new index's prefix serves every
    # read the tenant index served.
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.create_index("ix_jobs_tenant_id_status", ["tenant_id", "status"], unique=False)
        batch_op.drop_index("ix_jobs_tenant_id")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.create_index("ix_jobs_tenant_id", ["tenant_id"], unique=False)
        batch_op.drop_index("ix_jobs_tenant_id_status")
