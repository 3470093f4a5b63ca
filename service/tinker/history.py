"""A Tinker run's loss history, for the dashboard's curve: the `loss:sum` of each finished
`forward_backward` (and `forward`) of the run, in the order they ran."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import TinkerRequest, TinkerRun

MAX_POINTS = 2000  # the newest; a curve needs no more


def loss_history(session: Session, run: TinkerRun) -> list[dict[str, Any]]:
    """[{n, kind, loss, at}] oldest first: n counts the run's forward passes from 1."""
    rows = session.execute(
        select(
            TinkerRequest.seq, TinkerRequest.kind, TinkerRequest.result, TinkerRequest.finished_at
        )
        .where(
            TinkerRequest.run_id == run.id,
            TinkerRequest.kind.in_(("forward_backward", "forward")),
            TinkerRequest.status == "done",
        )
        .order_by(TinkerRequest.seq.desc())
        .limit(MAX_POINTS)
    ).all()
    points = []
    for n, (_, kind, result, at) in enumerate(reversed(rows), start=1):
        loss = ((result or {}).get("metrics") or {}).get("loss:sum")
        if isinstance(loss, int | float) and math.isfinite(loss):
            points.append({"n": n, "kind": kind, "loss": float(loss), "at": at.isoformat()})
    return points
