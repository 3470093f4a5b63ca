"""Run the Alembic migrations programmatically (`grpo-service migrate`; `up` runs it too)."""

from importlib.util import find_spec
from pathlib import Path

from alembic import command
from alembic.config import Config

# The `migrations` package: the repository's folder, or its installed copy (it ships in the wheel).
_spec = find_spec("migrations")
assert _spec is not None and _spec.origin is not None, "the migrations package is not installed"
MIGRATIONS_DIR = Path(_spec.origin).parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
