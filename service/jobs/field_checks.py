"""The record fields a submission's verifiers read, checked against its datasets' records.

A verifier that reads `answer` from records that carry `target` errors on every completion;
refused here, at submission, with a 422 at the verifier's reference naming the missing field,
the fields the records do have, and the closest of them. The fields a verifier needs come from
its stored config (`workers.verifiers.fields`: never by running tenant code); the records'
from the first `FIELD_SAMPLE` records of the dataset, read one at a time at its first
submission and kept on its row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.core.problems import FieldError
from service.core.suggest import did_you_mean
from service.datasets.service import FIELD_SAMPLE, record_fields
from service.jobs.schemas import JobCreate
from service.models import Dataset
from service.storage import ObjectStorage
from workers.verifiers import Resolver
from workers.verifiers.fields import needed_fields

MAX_LISTED = 40  # the records' fields named in a message at most
MAX_KEPT = 1000  # the most fields kept on the dataset's row


@dataclass
class FieldUse:
    """Verifiers (pinned references) scoring one dataset's records; `path` is where the
    references sit in the request (`verifiers`, `eval_verifiers`)."""

    path: str
    verifiers: Sequence[dict[str, Any]]
    dataset: Dataset
    extra: frozenset[str] = frozenset()  # fields the samples carry besides the record's


def check_verifier_fields(
    storage: ObjectStorage, uses: Sequence[FieldUse], resolve: Resolver
) -> list[FieldError]:
    """One error per verifier reference and dataset whose records lack a field it needs."""
    fields_of: dict[str, set[str]] = {}  # a dataset's fields, read once
    errors: list[FieldError] = []
    for use in uses:
        for i, ref in enumerate(use.verifiers):
            try:
                _, kind, config = resolve(ref["name"], ref["version"])
            except LookupError:
                continue  # reported by the pinning itself
            needed = needed_fields(kind, config, resolve)
            if not needed:
                continue
            if use.dataset.id not in fields_of:
                fields_of[use.dataset.id] = _record_fields(storage, use.dataset)
            have = fields_of[use.dataset.id] | use.extra
            for name in sorted(needed - have):
                message = _missing(ref["name"], name, use.dataset, have)
                errors.append(FieldError(path=f"$.{use.path}[{i}]", message=message))
    return errors


def _record_fields(storage: ObjectStorage, dataset: Dataset) -> set[str]:
    """The dataset's fields, read once and kept on its row (its records never change), as
    its prompt statistics are (`model_checks.prompt_stats`); a set too large to keep is read
    again at each submission."""
    stats = dataset.prompt_stats or {}
    if isinstance(stats.get("fields"), list):
        return set(stats["fields"])
    fields = record_fields(storage, dataset)
    if len(fields) <= MAX_KEPT:
        dataset.prompt_stats = {**stats, "fields": sorted(fields)}  # a new dict: JSON sees it
    return fields


def _missing(verifier: str, name: str, dataset: Dataset, have: set[str]) -> str:
    read = min(dataset.num_records, FIELD_SAMPLE)
    where = (
        f"the records of {dataset.id}"
        if read == dataset.num_records
        else f"the first {read} records of {dataset.id}"
    )
    listed = sorted(have)
    shown = ", ".join(f"'{f}'" for f in listed[:MAX_LISTED])
    if len(listed) > MAX_LISTED:
        shown += f" and {len(listed) - MAX_LISTED} more"
    return (
        f"verifier '{verifier}' reads the record field '{name}', which none of {where} has "
        f"(their fields: {shown}){did_you_mean(name, listed)}"
    )


def check_job_fields(
    storage: ObjectStorage,
    body: JobCreate,
    datasets: dict[str, Dataset],
    pinned: dict[str, list[dict[str, Any]]],
    resolve: Resolver,
) -> list[FieldError]:
    """A job's verifiers against its dataset, and its evaluation's (eval_verifiers, or the
    verifiers when unset) against its eval_dataset. `pinned`: each list of references that
    pinned without an error, by its field. An environment's samples carry `messages` too."""
    extra = frozenset({"messages"}) if body.environment is not None else frozenset()
    eval_field = "eval_verifiers" if body.eval_verifiers is not None else "verifiers"
    uses = [
        FieldUse(path, pinned[path], datasets[dataset], extra)
        for path, dataset in (("verifiers", "dataset"), (eval_field, "eval_dataset"))
        if path in pinned and dataset in datasets
    ]
    return check_verifier_fields(storage, uses, resolve)
