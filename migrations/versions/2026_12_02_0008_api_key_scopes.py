"""api keys with scopes (read or full)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing keys keep what they could do: full.
    op.add_column(
        "api_keys",
        sa.Column("scope", sa.String(length=16), server_default="full", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("api_keys", "scope")
