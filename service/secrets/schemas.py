from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime

SECRET_NAME = r"^[A-Za-z0-9_.\-]{1,100}$"


class SecretCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "wandb", "value": "<your W&B API key>"}]},
    )

    name: str = Field(pattern=SECRET_NAME, description="Your name for it (`wandb_secret` etc.).")
    value: str = Field(
        min_length=1, max_length=8192, description="Write-only: never returned or shown."
    )


class SecretOut(BaseModel):
    """A secret's name and dates; its value is never returned."""

    name: str
    created_at: UtcDateTime
    updated_at: UtcDateTime
