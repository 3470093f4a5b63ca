from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime


class DatasetCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "digits",
                    "records": [{"prompt": "Digit 7:", "answer": "7"}],
                }
            ]
        },
    )

    name: str = Field(min_length=1, max_length=200)
    records: list[dict[str, Any]] = Field(min_length=1)


class DatasetOut(BaseModel):
    id: str
    name: str
    num_records: int
    sha256: str
    created_at: UtcDateTime


class DatasetRecordOut(BaseModel):
    """One stored record of a dataset, in file order."""

    id: str = Field(description="The record's 0-based position, as a string; usable as `after`.")
    index: int = Field(description="The record's 0-based position in the dataset.")
    record: dict[str, Any]
