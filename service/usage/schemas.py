"""Usage report bodies (docs/usage.md)."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GroupBy = Literal["job", "day"]


class UsageFigures(BaseModel):
    device_seconds: float = Field(
        description="Wall-clock seconds the jobs' attempts held devices, times the devices; "
        "a step redone after a resume counts again."
    )
    device_seconds_by_kind: dict[str, float] = Field(
        default_factory=dict, description="`device_seconds` by device kind (`cpu`, `cuda:<name>`)."
    )
    completion_tokens: int = Field(
        description="Completion tokens sampled (refills and evaluation included), each step once."
    )
    trained_tokens: int = Field(
        description="Prompt + loss-carrying completion tokens through each training pass."
    )
    verifier_cpu_seconds: float = Field(description="CPU seconds the verifiers used scoring.")
    storage_bytes: int = Field(
        description="Bytes of the jobs' stored objects (checkpoints, rollout files) and of the "
        "Tinker checkpoints still kept, by the day they were written."
    )


class UsageRow(UsageFigures):
    job_id: str | None = Field(None, description="The job (`group_by=job`).")
    day: date | None = Field(None, description="The UTC day (`group_by=day`).")
    steps: int = Field(0, description="Steps recorded (a redone step again).")


class BudgetOut(BaseModel):
    device_hours_limit: float
    device_hours_used: float = Field(description="All of the tenant's usage, for all time.")


class UsageReport(BaseModel):
    model_config = ConfigDict(
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "from": "2026-12-01",
                    "to": "2027-01-01",
                    "group_by": "day",
                    "data": [
                        {
                            "day": "2026-12-02",
                            "job_id": None,
                            "steps": 40,
                            "device_seconds": 812.5,
                            "device_seconds_by_kind": {"cuda:NVIDIA H100 80GB HBM3": 812.5},
                            "completion_tokens": 655360,
                            "trained_tokens": 901120,
                            "verifier_cpu_seconds": 14.2,
                            "storage_bytes": 3221225472,
                        }
                    ],
                    "totals": {
                        "device_seconds": 812.5,
                        "device_seconds_by_kind": {"cuda:NVIDIA H100 80GB HBM3": 812.5},
                        "completion_tokens": 655360,
                        "trained_tokens": 901120,
                        "verifier_cpu_seconds": 14.2,
                        "storage_bytes": 3221225472,
                    },
                    "budget": {"device_hours_limit": 100.0, "device_hours_used": 0.23},
                }
            ]
        },
    )

    from_: date = Field(alias="from", description="First UTC day counted.")
    to: date = Field(description="First UTC day not counted.")
    group_by: GroupBy
    data: list[UsageRow]
    totals: UsageFigures
    budget: BudgetOut | None = Field(None, description="The tenant's budget, if it has one.")
