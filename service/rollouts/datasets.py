"""Datasets made from a job's stored rollouts: `sft` keeps each completion as
`{prompt, completion, reward}`; `dpo` pairs the best and the worst completion of each group whose
rewards differ as `{prompt, chosen, rejected}`.

A record's prompt is the rollout's chat messages when the dataset record was chat-shaped, else
the prompt text the model saw, so the made dataset trains and evaluates like an uploaded one.
Rows are read one step file at a time, in the rollouts' order (step, group, index).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import groupby
from typing import Any

from sqlalchemy.orm import Session

from service.core.problems import FieldError, invalid
from service.datasets import service as datasets
from service.datasets.builder import DatasetBuilder
from service.jobs.service import get_job
from service.models import Dataset, Job
from service.rollouts.schemas import FromRollouts
from service.rollouts.service import iter_step_rows
from service.settings import Settings
from service.storage import ObjectStorage


def _prompt(row: dict[str, Any]) -> Any:
    return row["messages"] if row["messages"] is not None else row["prompt"]


def sft_records(rows: Iterable[dict[str, Any]], min_reward: float | None) -> Iterator[dict]:
    """Every completion whose reward is at least `min_reward` (all when None)."""
    for row in rows:
        if min_reward is None or row["reward"] >= min_reward:
            yield {"prompt": _prompt(row), "completion": row["completion"], "reward": row["reward"]}


def dpo_records(rows: Iterable[dict[str, Any]], min_reward: float | None) -> Iterator[dict]:
    """Per group (rows of one step and group, in index order): the first completion of the
    highest reward is chosen, the first of the lowest rejected. A group whose rewards are all
    equal says nothing of preference and is skipped, as is one whose best reward is below
    `min_reward`."""
    for _, members in groupby(rows, key=lambda r: (r["step"], r["split"], r["group"])):
        group = list(members)
        best = max(group, key=lambda r: r["reward"])  # max/min keep the first of equals
        worst = min(group, key=lambda r: r["reward"])
        if best["reward"] == worst["reward"]:
            continue
        if min_reward is not None and best["reward"] < min_reward:
            continue
        yield {"prompt": _prompt(best), "chosen": best["completion"],
               "rejected": worst["completion"]}  # fmt: skip


_FORMATS = {"sft": sft_records, "dpo": dpo_records}


def _check_steps(request: FromRollouts, job: Job) -> None:
    total = int((job.spec or {}).get("grpo", {}).get("steps") or 0)
    errors = [
        FieldError(path=f"$.steps[{i}]", message=f"step {s} is past the job's last step ({total})")
        for i, s in enumerate(request.steps or [])
        if total and s > total
    ]
    if errors:
        raise invalid(errors)


def _nothing_matched(request: FromRollouts, job: Job, stored: int) -> FieldError:
    where = f"split '{request.split}'" + (f", steps {request.steps}" if request.steps else "")
    if not stored:
        message = f"job '{job.id}' has no stored rollouts ({where})"
        return FieldError(path="$.job_id", message=message)
    if request.min_reward is not None:
        message = f"none of the job's {stored} rollouts ({where}) reach min_reward"
        return FieldError(path="$.min_reward", message=message)
    message = f"every group of the job's {stored} rollouts ({where}) has equal rewards"
    return FieldError(path="$.format", message=message)


def dataset_from_rollouts(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    request: FromRollouts,
) -> Dataset:
    job = get_job(session, tenant_id, request.job_id)  # 404 as for a missing job
    _check_steps(request, job)
    stored = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal stored
        for row in iter_step_rows(session, storage, job, request.split, request.steps):
            stored += 1
            yield row

    limit = settings.max_dataset_records
    builder = DatasetBuilder(limit)
    for i, record in enumerate(_FORMATS[request.format](rows(), request.min_reward)):
        builder.add(record, f"$.records[{i}]")
        if builder.done:
            break
    built = builder.built
    if built.num_records > limit:
        message = (f"the rollouts make more than {limit} records, the most a dataset holds: "
                   "choose fewer steps or a min_reward")  # fmt: skip
        raise invalid([FieldError(path="$.steps", message=message)])
    if built.errors:
        raise invalid(built.errors)
    if not built.num_records:
        raise invalid([_nothing_matched(request, job, stored)])
    name = request.name or f"{job.id}-{request.format}"
    return datasets.create_dataset(session, storage, settings, tenant_id, name, built)
