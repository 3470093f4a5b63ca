"""The request and response fields every versioned resource shares; a domain's schemas
subclass these, narrowing `kind` and adding its examples."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"


def with_example(**body: Any) -> ConfigDict:
    """A create schema's config: its OpenAPI example (the base's `extra="forbid"` stays)."""
    return ConfigDict(json_schema_extra={"examples": [body]})


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Posting an existing name adds a version.")
    kind: str
    description: str = Field("", max_length=2000)
    config: dict[str, Any] = Field(default_factory=dict)


class VersionOut(BaseModel):
    id: str
    name: str
    version: int
    kind: str
    description: str
    config: dict[str, Any]
    sha256: str  # of the canonical kind+config; each domain's schema says what it traces
    created_at: UtcDateTime
