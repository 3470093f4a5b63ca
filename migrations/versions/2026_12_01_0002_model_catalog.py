"""model catalog, job lineage, dataset prompt statistics

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "catalog_models",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("source", sa.String(length=1000), nullable=False),
        sa.Column("source_kind", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("architecture", sa.String(length=200), nullable=False),
        sa.Column("model_type", sa.String(length=100), nullable=False),
        sa.Column("num_parameters", sa.BigInteger(), nullable=False),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("hidden_size", sa.Integer(), nullable=False),
        sa.Column("num_layers", sa.Integer(), nullable=False),
        sa.Column("vocab_size", sa.Integer(), nullable=False),
        sa.Column("intermediate_size", sa.Integer(), nullable=False),
        sa.Column("kv_dim", sa.Integer(), nullable=False),
        sa.Column("lora_targets", sa.JSON(), nullable=False),
        sa.Column("chat_template", sa.Text(), nullable=True),
        sa.Column("tokenizer_key", sa.String(length=500), nullable=True),
        sa.Column("special_tokens", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_catalog_models")),
    )
    # Plain ALTER TABLE, no batch mode: SQLite adds columns in place, where a batch copy of
    # the table would be refused while other tables' foreign keys point at it.
    op.add_column("jobs", sa.Column("base_model", sa.String(length=100), nullable=True))
    op.add_column("jobs", sa.Column("memory_estimate", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("parent_checkpoint", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_jobs_base_model"), "jobs", ["base_model"], unique=False)
    op.create_index(op.f("ix_jobs_parent_checkpoint"), "jobs", ["parent_checkpoint"], unique=False)
    op.add_column(
        "datasets",
        sa.Column("prompt_stats", sa.JSON(), nullable=False, server_default=sa.text("'{}'")),
    )


def _drop_columns(table: str, columns: list[str]) -> None:
    """Drop columns in place. Alembic's batch mode would copy the table and drop the old one,
    which SQLite refuses while other tables' foreign keys point at it (jobs -> datasets);
    SQLite drops a plain column itself since 3.35."""
    if op.get_bind().dialect.name == "sqlite":
        for column in columns:
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        return
    for column in columns:
        op.drop_column(table, column)


def downgrade() -> None:
    _drop_columns("datasets", ["prompt_stats"])
    op.drop_index(op.f("ix_jobs_parent_checkpoint"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_base_model"), table_name="jobs")
    _drop_columns("jobs", ["parent_checkpoint", "memory_estimate", "base_model"])
    op.drop_table("catalog_models")
