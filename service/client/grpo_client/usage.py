"""`grpo.usage`: the tenant's usage report and job estimates (docs/usage.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from grpo_client.models_generated import EstimateOut, UsageReport
from grpo_client.transport import Transport


class Usage:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def report(
        self,
        start: date | datetime | str | None = None,
        end: date | datetime | str | None = None,
        group_by: str = "day",
    ) -> UsageReport:
        """`GET /v1/usage`: whole UTC days from `start`'s through the day before `end`
        (default: this month), one row per day or per job, and the totals."""
        params: dict[str, str] = {"group_by": group_by}
        for name, value in (("from", start), ("to", end)):
            if value is not None:
                params[name] = value if isinstance(value, str) else value.isoformat()
        return UsageReport.model_validate(self._t.json("GET", "/v1/usage", params=params))

    def estimate(self, spec: Mapping[str, Any]) -> EstimateOut:
        """`POST /v1/jobs/estimate`: the device-seconds and tokens a job spec would take."""
        return EstimateOut.model_validate(self._t.json("POST", "/v1/jobs/estimate", json=spec))
