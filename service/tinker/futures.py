"""Tinker requests as futures in the database: the API queues one (`submit`), a tinker worker
claims and executes it (`claim_next`, `finish`), retrieve_future reads it back (`load`).

Order and fairness: a tenant's requests run oldest first (one at a time, so a run's requests
run in the order the SDK sent them: it sends the next only once the previous was accepted);
tenants take turns weighted by cost: the next turn is the tenant's whose requests took the
fewest device-seconds lately (GRPO_TINKER_FAIR_WINDOW_S), so a tenant of small requests does not
wait behind a queue of another's big ones, only behind the one running (which the caps of
service/tinker/caps.py and GRPO_TINKER_REQUEST_TIMEOUT_S bound). A claim is one conditional
UPDATE on the status it leaves (`queued`), its choice a subquery of the same statement, so two
workers never both take a request, on PostgreSQL as on SQLite, with no lock held between a read
and the claim.

Leases: a claim takes a lease of `lease_seconds` (epoch 1: a request is claimed once), the
worker renews it while the request runs and fences its outcome on it (service/core/leases.py).
A request whose lease lapsed (its worker died, hung, or lost the database) is failed with
LEASE_LAPSED by `fail_lapsed`, run by the reconciler and by every tinker worker: never queued
again, since a request is not idempotent (an optim_step twice is two steps) and the run's state
it changed died with the worker's memory.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, aliased

from service.core import leases
from service.core.ids import new_id
from service.models import CatalogModel, TinkerRequest, TinkerRun
from service.models.base import utcnow
from service.models.tinker_request import LEASE_LAPSED
from service.tinker import schemas
from service.tinker.service import bad_request, missing
from service.usage.budget import refuse_over_budget
from workers.tinker import validation as check
from workers.tinker.types import Datum, SamplingParams, TinkerInputError

OPEN = ("queued", "running")
RUNNING = ("running",)  # the status a claim's lease holds (service.core.leases' `active`)


def submit(
    session: Session,
    tenant_id: str,
    kind: str,
    base_model: str,
    payload: dict[str, Any],
    run: TinkerRun | None = None,
    *,
    status: str = "queued",
    result: dict[str, Any] | None = None,
) -> TinkerRequest:
    """A new future; `status` "done" with its `result` for what the API answers itself. Every
    request that queues device work answers 402 once the tenant's budget is spent, whatever
    its kind (an optim_step, a save, a load, a sample as a forward_backward)."""
    if status == "queued":
        refuse_over_budget(session, tenant_id)
    row = TinkerRequest(
        id=new_id("tkq"),
        tenant_id=tenant_id,
        run_id=run.id if run else None,
        base_model=base_model,
        kind=kind,
        payload=payload,
        status=status,
        result=result,
        finished_at=utcnow() if status == "done" else None,
    )
    if run is not None:
        run.last_request_at = utcnow()
    session.add(row)
    session.flush()
    return row


def load(session: Session, tenant_id: str, request_id: str) -> TinkerRequest:
    row = session.scalars(select(TinkerRequest).where(TinkerRequest.id == request_id)).first()
    if row is None or row.tenant_id != tenant_id:
        raise missing("request", request_id)
    return row


def queue_position(session: Session, row: TinkerRequest) -> int:
    """How many of its own tenant's open requests are before this one (0: it is the tenant's
    next). Other tenants' requests are not counted, however many wait: a tenant's answers say
    nothing of another's activity (docs/rate-limits.md)."""
    own = session.scalar(
        select(func.count())
        .select_from(TinkerRequest)
        .where(
            TinkerRequest.status.in_(OPEN),
            TinkerRequest.tenant_id == row.tenant_id,
            TinkerRequest.seq < row.seq,
        )
    )
    return int(own or 0)


# Validation at submission: the engine's own checks (workers/tinker/validation.py, torch-free,
# reading the loss registry), answered as a 400 naming the same field before queueing.


@contextmanager
def engine_checks() -> Iterator[None]:
    try:
        yield
    except TinkerInputError as exc:
        raise bad_request(exc.field, exc.message) from None


def _limits(model: CatalogModel) -> check.ModelLimits:
    return check.ModelLimits(vocab_size=model.vocab_size, context=model.context_length)


def check_forward_backward(body: Mapping[str, Any], model: CatalogModel) -> None:
    data = [Datum(d["tokens"], d["loss_fn_inputs"]) for d in body.get("data") or []]
    with engine_checks():
        spec, _ = check.check_loss(body.get("loss_fn") or "", body.get("loss_fn_config"))
        check.check_data(data, spec, _limits(model))


def check_sample(
    prompt: list[int], num_samples: int, params: schemas.SamplingParamsIn, model: CatalogModel
) -> None:
    """As the engine checks a sample; the API also asks for `max_tokens` (without one, the
    engine draws up to the context)."""
    if params.max_tokens is None:
        raise bad_request("sampling_params.max_tokens", "a positive number of tokens is needed")
    engine_params = SamplingParams(**params.model_dump())
    with engine_checks():
        check.check_sample(prompt, num_samples, engine_params, _limits(model))


# The worker's side


def any_queued(session: Session, bases: Collection[str] | None = None) -> bool:
    """Whether a request waits: one probe of the (status, seq) index, read-only. An idle worker
    asks this between its looks, not `claim_next`, whose UPDATE and fair-turn subqueries
    cost far more and take SQLite's write lock each time."""
    queued = select(TinkerRequest.seq).where(TinkerRequest.status == "queued")
    if bases is not None:
        queued = queued.where(TinkerRequest.base_model.in_(list(bases)))
    return session.scalar(queued.limit(1)) is not None


def claim_next(
    session: Session,
    worker: str,
    bases: Collection[str] | None = None,
    *,
    lease_seconds: float,
    window_seconds: float,
) -> TinkerRequest | None:
    """The next request for this worker, claimed under a lease of `lease_seconds`, or None.

    One conditional UPDATE, its choice a subquery: among tenants with nothing running (a
    tenant's requests one at a time), the oldest queued request of the tenant whose requests
    finished in the last `window_seconds` took the fewest device-seconds (ties: the oldest).
    Two workers that pick the same request: the status condition lets one have it, the other
    finds nothing this time and looks again."""
    head, busy, spent = (aliased(TinkerRequest, name=n) for n in ("head", "busy", "spent"))
    heads = select(head.tenant_id, func.min(head.seq).label("seq")).where(head.status == "queued")
    if bases is not None:
        heads = heads.where(head.base_model.in_(list(bases)))
    tenants = heads.group_by(head.tenant_id).subquery("heads")
    now = utcnow()
    cost = (
        select(func.coalesce(func.sum(spent.device_seconds), 0.0))
        .where(
            spent.tenant_id == tenants.c.tenant_id,
            spent.finished_at >= now - timedelta(seconds=window_seconds),
        )
        .scalar_subquery()
    )
    running = select(busy.seq).where(busy.tenant_id == tenants.c.tenant_id,
                                     busy.status == "running")  # fmt: skip
    turn = (
        select(tenants.c.seq)
        .where(~running.exists())
        .order_by(cost, tenants.c.seq)
        .limit(1)
        .scalar_subquery()
    )
    seq = session.scalar(
        update(TinkerRequest)
        .where(TinkerRequest.seq == turn, TinkerRequest.status == "queued")
        .values(
            status="running",
            started_at=now,
            worker=worker,
            epoch=TinkerRequest.epoch + 1,
            lease_until=now + timedelta(seconds=lease_seconds),
        )
        .returning(TinkerRequest.seq)
        .execution_options(synchronize_session=False)
    )
    return None if seq is None else session.get(TinkerRequest, seq, populate_existing=True)


def finish(
    session: Session,
    seq: int,
    *,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    device_seconds: float = 0.0,
    epoch: int | None = None,
) -> None:
    """The request's outcome, while it is running (under the claim of `epoch` when given: the
    worker fences first, service.core.leases.fence, and this holds to the same claim)."""
    held = [TinkerRequest.seq == seq, TinkerRequest.status == "running"]
    if epoch is not None:
        held.append(TinkerRequest.epoch == epoch)
    session.execute(
        update(TinkerRequest)
        .where(*held)
        .values(
            status="failed" if error is not None else "done",
            result=result,
            error=error,
            device_seconds=device_seconds,
            finished_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )


def fail_lapsed(session: Session) -> int:
    """Fail the running requests whose lease lapsed, with an error naming it; how many."""
    return leases.fail_lapsed(session, TinkerRequest, LEASE_LAPSED)


def new_checkpoint_id() -> str:
    return new_id("tkc")
