"""Reading a job's rollouts: a page of rows across the stored step files, or all of them as
one Parquet stream.

Rows are ordered by step, then train before eval, then group and index; a cursor
`{split}-{step}-{group}-{index}` is a position in that order. A page reads the step files in
order, one at a time, filtering each with pyarrow, until it has `limit` + 1 rows (the extra one
says `has_more`). Filters that match little (a reward range, say) may read many files for one
page; each is one step's rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import case, select
from sqlalchemy.orm import Session

from service.core.problems import FieldError, invalid
from service.models import Job, RolloutFile
from service.rollouts.format import SCHEMA, decode_rows, read_table, stream_concatenated
from service.rollouts.schemas import RolloutFilters
from service.storage import ObjectStorage

SPLIT_ORDER = {"train": 0, "eval": 1}
_CURSOR = re.compile(r"^(train|eval)-([0-9]{1,9})-([0-9]{1,9})-([0-9]{1,9})$")
Position = tuple[int, int, int, int]  # (step, split order, group, index)
_ERRORS = SCHEMA.field("errors").type
_ERROR_ENTRY = pa.struct([_ERRORS.key_field, _ERRORS.item_field])


def rollout_id(row: dict[str, Any]) -> str:
    return f"{row['split']}-{row['step']}-{row['group']}-{row['index']}"


def parse_cursor(after: str | None) -> Position | None:
    if after is None:
        return None
    match = _CURSOR.match(after)
    if match is None:
        message = "must be a rollout id: {split}-{step}-{group}-{index}, e.g. train-3-0-1"
        raise invalid([FieldError(path="query.after", message=message)])
    split, step, group, index = match.groups()
    return int(step), SPLIT_ORDER[split], int(group), int(index)


def check_filters(filters: RolloutFilters) -> None:
    low, high = filters.min_reward, filters.max_reward
    if low is not None and high is not None and low > high:
        message = f"must be at least min_reward ({low})"
        raise invalid([FieldError(path="query.max_reward", message=message)])


def _files(session: Session, job: Job, split: str | None, step: int | None, start: int) -> Any:
    """The job's step files in reading order (metadata only, streamed from the database)."""
    stmt = select(RolloutFile.step, RolloutFile.split, RolloutFile.object_key).where(
        RolloutFile.job_id == job.id, RolloutFile.step >= start
    )
    if split is not None:
        stmt = stmt.where(RolloutFile.split == split)
    if step is not None:
        stmt = stmt.where(RolloutFile.step == step)
    order = case((RolloutFile.split == "train", 0), else_=1)
    return session.execute(stmt.order_by(RolloutFile.step, order)).yield_per(200)


def _matching(table: pa.Table, filters: RolloutFilters) -> pa.Table:
    mask = pa.array([True] * table.num_rows)
    if filters.record is not None:
        mask = pc.and_(mask, pc.equal(table["record"], filters.record))
    if filters.min_reward is not None:
        mask = pc.and_(mask, pc.greater_equal(table["reward"], filters.min_reward))
    if filters.max_reward is not None:
        mask = pc.and_(mask, pc.less_equal(table["reward"], filters.max_reward))
    if filters.verifier_error is not None:
        # list_value_length has no map kernel: a map is a list of (key, value) structs.
        entries = table["errors"].cast(pa.list_(_ERROR_ENTRY))
        has_error = pc.greater(pc.list_value_length(entries), 0)
        mask = pc.and_(mask, has_error if filters.verifier_error else pc.invert(has_error))
    return table.filter(mask)


def list_rollouts(
    session: Session,
    storage: ObjectStorage,
    job: Job,
    filters: RolloutFilters,
    limit: int,
    after: str | None,
) -> tuple[list[dict[str, Any]], bool, str | None]:
    """One page of rows after the cursor: (rows with their ids, has_more, next cursor)."""
    check_filters(filters)
    cursor = parse_cursor(after)
    found: list[dict[str, Any]] = []
    start = cursor[0] if cursor else 0
    for step, split, key in _files(session, job, filters.split, filters.step, start):
        if cursor is not None and (step, SPLIT_ORDER[split]) < cursor[:2]:
            continue  # an eval file of the cursor's step, when the cursor is past it
        table = _matching(read_table(storage.get_bytes(key)), filters)
        for row in decode_rows(table):
            position = (step, SPLIT_ORDER[split], row["group"], row["index"])
            if cursor is None or position > cursor:
                found.append({"id": rollout_id(row), **row})
        if len(found) > limit:
            break
    has_more = len(found) > limit
    rows = found[:limit]
    return rows, has_more, (rows[-1]["id"] if has_more else None)


def download_keys(session: Session, job: Job, split: str | None) -> list[str]:
    """The object keys of every step file, in reading order, read before the stream starts
    (the request's session is gone by the time the body is sent)."""
    return [key for _, _, key in _files(session, job, split, None, 0)]


def download_stream(storage: ObjectStorage, keys: list[str]) -> Iterator[bytes]:
    return stream_concatenated(keys, storage.get_bytes)


def iter_step_rows(
    session: Session, storage: ObjectStorage, job: Job, split: str, steps: list[int] | None
) -> Iterator[dict[str, Any]]:
    """Every stored row of `split` (of `steps` only, when given), in reading order, one step
    file in memory at a time. The file list is read first, so the session is free after."""
    wanted = None if steps is None else set(steps)
    files = [(step, key) for step, _, key in _files(session, job, split, None, 0)]
    for step, key in files:
        if wanted is None or step in wanted:
            yield from decode_rows(read_table(storage.get_bytes(key)))
