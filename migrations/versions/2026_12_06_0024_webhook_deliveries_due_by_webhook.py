"""webhook deliveries indexed by (webhook, status, next_attempt_at): claims in tenant turns
(issue 46 item 7)

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 10:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The dispatcher asks, per webhook, whether a delivery is due and which is due longest: one
    # index probe each, whatever backlog or history the webhook has. The new index's prefix
    # serves every read the webhook index served (the delivery log, a webhook's deletion).
    with op.batch_alter_table("webhook_deliveries") as batch_op:
        batch_op.create_index(
            "ix_webhook_deliveries_webhook_due",
            ["webhook_id", "status", "next_attempt_at"],
            unique=False,
        )
        batch_op.drop_index("ix_webhook_deliveries_webhook_id")


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch_op:
        batch_op.create_index("ix_webhook_deliveries_webhook_id", ["webhook_id"], unique=False)
        batch_op.drop_index("ix_webhook_deliveries_webhook_due")
