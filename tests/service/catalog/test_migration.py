"""The catalog migration (0002) on SQLite and PostgreSQL: the schema at head is exactly the ORM
models', and 0002 goes down and up again over existing rows without losing them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from service.core.db import make_engine
from service.core.migrate import downgrade, upgrade
from service.models import Base


def test_head_matches_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_catalog_migration_down_and_up_keeps_rows(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES "
                          "('ten_m', 'migrating', CURRENT_TIMESTAMP)"))  # fmt: skip
        conn.execute(text(
            "INSERT INTO datasets (id, tenant_id, name, num_records, sha256, object_key, "
            "created_at) VALUES ('ds_j', 'ten_m', 'd', 1, 'x', 'k', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        conn.execute(text(  # a job pointing at the dataset: SQLite must not copy the table
            "INSERT INTO jobs (id, tenant_id, dataset_id, status, spec, step, total_steps, "
            "epoch, attempts, queue, created_at, base_model, parent_checkpoint) VALUES ('job_m', "
            "'ten_m', 'ds_j', 'succeeded', '{}', 0, 1, 0, 0, 'gpu', CURRENT_TIMESTAMP, 'tiny', "
            "'ckpt_x')"
        ))  # fmt: skip
    downgrade(db_url, "0001")
    with engine.begin() as conn:
        columns = {
            r[0] for r in conn.execute(text("SELECT * FROM jobs LIMIT 0")).cursor.description
        }
        assert "parent_checkpoint" not in columns and "base_model" not in columns
        conn.execute(text(
            "INSERT INTO datasets (id, tenant_id, name, num_records, sha256, object_key, "
            "created_at) VALUES ('ds_m', 'ten_m', 'd', 1, 'x', 'k', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
    upgrade(db_url)
    with engine.begin() as conn:
        stats = conn.execute(text("SELECT prompt_stats FROM datasets WHERE id = 'ds_m'")).scalar()
        assert stats in ({}, "{}")  # a dataset uploaded before 0002: measured on first use
        assert conn.execute(text("SELECT count(*) FROM catalog_models")).scalar() == 0
        job = conn.execute(text("SELECT dataset_id, base_model FROM jobs WHERE id = 'job_m'"))
        assert tuple(job.one()) == ("ds_j", None)  # the row survived; its new columns are new
        conn.execute(text("DELETE FROM jobs WHERE id = 'job_m'"))
        conn.execute(text("DELETE FROM datasets WHERE id IN ('ds_m', 'ds_j')"))
        conn.execute(text("DELETE FROM tenants WHERE id = 'ten_m'"))
    engine.dispose()
