"""A job's rollouts from the client: pages of rows (iterating walks them all), a pandas frame,
the Parquet download. `client.jobs.rollouts(...)` and `client.jobs.download_rollouts(...)`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_client.models import Page
from grpo_client.models_generated import RolloutOut
from grpo_client.transport import Transport


class RolloutPage(Page[RolloutOut]):
    """One page of rollout rows; iterating it (or `to_pandas`) fetches every later page."""

    def to_pandas(self) -> Any:
        """Every row from this page on as a pandas DataFrame (pandas must be installed)."""
        try:
            import pandas
        except ImportError as exc:  # an optional dependency of the client
            raise ImportError("to_pandas() needs pandas: pip install pandas") from exc
        return pandas.DataFrame([row.model_dump() for row in self])


def list_rollouts(
    transport: Transport, job_id: str, *, limit: int, after: str | None, **filters: Any
) -> RolloutPage:
    params = {k: _param(v) for k, v in filters.items() if v is not None}
    if after:
        params["after"] = after
    data = transport.json("GET", f"/v1/jobs/{job_id}/rollouts", params={"limit": limit, **params})
    page = RolloutPage.model_validate(data)
    return page.with_fetcher(  # type: ignore[return-value]  # the same page type
        lambda nxt: list_rollouts(transport, job_id, limit=limit, after=nxt, **filters)
    )


def _param(value: Any) -> Any:
    return str(value).lower() if isinstance(value, bool) else value  # true/false in a URL


def download_rollouts(
    transport: Transport, job_id: str, path: str | Path, split: str | None = None
) -> Path:
    """Stream the job's rollouts (one Parquet file) to `path`; returns it."""
    target = Path(path)
    partial = target.with_name(target.name + ".part")
    params = {"split": split} if split else {}
    with (
        transport.stream("GET", f"/v1/jobs/{job_id}/rollouts/download", params=params) as resp,
        partial.open("wb") as fh,
    ):
        for chunk in resp.iter_bytes():
            fh.write(chunk)
    partial.replace(target)  # a complete file or none: never a half-written Parquet
    return target
