"""Tinker-compatible API: sessions, runs, checkpoints and queued requests (issue 35)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 14:55:33.422997
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tinker_requests",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("device_seconds", sa.Float(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tinker_requests_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_tinker_requests")),
        sa.UniqueConstraint("id", name=op.f("uq_tinker_requests_id")),
    )
    with op.batch_alter_table("tinker_requests", schema=None) as batch_op:
        batch_op.create_index("ix_tinker_requests_status_seq", ["status", "seq"], unique=False)
        batch_op.create_index("ix_tinker_requests_tenant_id", ["tenant_id"], unique=False)

    op.create_table(
        "tinker_runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=False),
        sa.Column("lora_config", sa.JSON(), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_request_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tinker_runs_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_runs")),
    )
    with op.batch_alter_table("tinker_runs", schema=None) as batch_op:
        batch_op.create_index("ix_tinker_runs_tenant_id", ["tenant_id"], unique=False)

    op.create_table(
        "tinker_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=True),
        sa.Column("model_path", sa.String(length=500), nullable=True),
        sa.Column("clients", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tinker_sessions_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_sessions")),
    )
    with op.batch_alter_table("tinker_sessions", schema=None) as batch_op:
        batch_op.create_index("ix_tinker_sessions_tenant_id", ["tenant_id"], unique=False)

    op.create_table(
        "tinker_checkpoints",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("object_key", sa.String(length=500), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tinker_runs.id"],
            name=op.f("fk_tinker_checkpoints_run_id_tinker_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tinker_checkpoints_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_checkpoints")),
        sa.UniqueConstraint("run_id", "kind", "name", name=op.f("uq_tinker_checkpoints_run_id")),
    )
    with op.batch_alter_table("tinker_checkpoints", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_tinker_checkpoints_tenant_id"), ["tenant_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tinker_checkpoints_tenant_id"))

    op.drop_table("tinker_checkpoints")
    with op.batch_alter_table("tinker_sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_tinker_sessions_tenant_id")

    op.drop_table("tinker_sessions")
    with op.batch_alter_table("tinker_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_tinker_runs_tenant_id")

    op.drop_table("tinker_runs")
    with op.batch_alter_table("tinker_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_tinker_requests_tenant_id")
        batch_op.drop_index("ix_tinker_requests_status_seq")

    op.drop_table("tinker_requests")
