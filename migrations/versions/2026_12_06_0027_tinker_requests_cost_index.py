"""tinker requests indexed by (tenant_id, finished_at): the claim's turns weighted by each
tenant's recent device-seconds (issue 46 item 2)

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 12:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_tinker_requests_tenant_id_finished_at"


def upgrade() -> None:
    # Every claim sums, per tenant with a request queued, the device-seconds of its requests
    # finished in the fairness window: a range of this index, not all the tenant's history.
    op.create_index(INDEX, "tinker_requests", ["tenant_id", "finished_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="tinker_requests")
