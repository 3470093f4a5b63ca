"""Cursor pagination shared by every list: `?limit=&after=<id>`, newest first."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel
from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

T = TypeVar("T")

# Bounds of integers taken from a URL: the database's integer and bigint (a larger one failed
# there as a 500); steps, versions and counts are integers, event ids bigints.
MAX_INT = 2**31 - 1
MAX_ID = 2**63 - 1


class Page(BaseModel, Generic[T]):
    data: list[T]
    has_more: bool
    next: str | None


class PageParams(BaseModel):
    limit: int
    after: str | None


def page_params(
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
    after: Annotated[
        str | None,
        Query(
            pattern=r"^[A-Za-z0-9_.\-]{1,128}$",
            description="Id of the last item of the previous page.",
        ),
    ] = None,
) -> PageParams:
    return PageParams(limit=limit, after=after)


PageDep = Annotated[PageParams, Depends(page_params)]


def paginate(
    session: Session, stmt: Select[Any], id_column: InstrumentedAttribute[str], params: PageParams
) -> tuple[list[Any], bool, str | None]:
    """Rows newest first (ids sort by creation time), one extra row fetched to learn has_more."""
    if params.after:
        stmt = stmt.where(id_column < params.after)
    rows = list(session.scalars(stmt.order_by(id_column.desc()).limit(params.limit + 1)))
    has_more = len(rows) > params.limit
    rows = rows[: params.limit]
    return rows, has_more, (rows[-1].id if has_more and rows else None)
