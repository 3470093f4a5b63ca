"""Schema pieces shared by every domain."""

from datetime import UTC, datetime
from typing import Annotated

from pydantic import PlainSerializer


def _rfc3339(value: datetime) -> str:
    # SQLite hands back naive datetimes; every stored time is UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


UtcDateTime = Annotated[datetime, PlainSerializer(_rfc3339, return_type=str)]
