"""The columns every named, versioned resource shares (verifiers, environments).

One immutable row per (tenant, name, version); `sha256` is of the canonical kind+config
(`service.registry.service.config_sha256`), so a job's results trace to the code that made
them. Each table keeps its own name and its unique constraint's name (`__table_args__`).
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import utcnow


class NamedVersion:
    """Mixin of a versioned table's columns: SQLAlchemy copies them onto each subclass."""

    if TYPE_CHECKING:  # each subclass is declarative: its constructor takes the columns

        def __init__(self, **columns: Any) -> None: ...

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict]
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
