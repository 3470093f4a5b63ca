"""Schema pieces shared by every domain."""

from datetime import UTC, datetime
from typing import Annotated

from pydantic import PlainSerializer, WithJsonSchema


def _rfc3339(value: datetime) -> str:
    # SQLite hands back naive datetimes; every stored time is UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# The OpenAPI document says date-time, not a bare string (the serializer returns a str), so
# that the client's generated models (service/client/generate_models.py) read a datetime.
UtcDateTime = Annotated[
    datetime,
    PlainSerializer(_rfc3339, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
