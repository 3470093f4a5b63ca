"""Tinker sessions, training runs, sampling sessions and checkpoints: the rows the routes read
and write. Another tenant's row is looked up like a missing one (the same 404 with the same
words), so an id or a tinker:// path says nothing about who owns it. No web framework here."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, ProblemError, too_many
from service.core.text import text_problem
from service.jobs import open_jobs
from service.models import CatalogModel, TinkerCheckpoint, TinkerRun, TinkerSession
from service.models.base import utcnow
from service.settings import Settings
from service.tinker import schemas
from service.usage.budget import refuse_over_budget
from workers.tinker.types import MAX_LORA_RANK

KIND_SEGMENT = {"training": "weights", "sampler": "sampler_weights"}
SEGMENT_KIND = {v: k for k, v in KIND_SEGMENT.items()}


def bad_request(field: str, message: str) -> ProblemError:
    """400, the status the SDK's own server answers for a bad request (BadRequestError)."""
    return ProblemError(
        400, "Bad Request", f"{field}: {message}", errors=[FieldError(path=field, message=message)]
    )


def missing(kind: str, ident: str) -> ProblemError:
    return ProblemError(404, "Not Found", f"{kind} '{ident}' not found")


def _comparable(ident: str) -> bool:
    """Whether the database can even compare `ident`: PostgreSQL refuses a NUL character in any
    text parameter (a 500), so an id or path with one (from the URL) is looked up as missing."""
    return bool(ident) and text_problem(ident) is None


# Sessions


def create_session(session: Session, settings: Settings, tenant_id: str) -> str:
    """A new session; 429 with Retry-After when the tenant holds GRPO_TINKER_MAX_OPEN_SESSIONS
    open ones (not finished, heartbeating), counted under the tenant's submission lock."""
    open_jobs.lock_tenant(session, tenant_id)
    idle = utcnow() - timedelta(seconds=settings.tinker_session_idle_s)
    held = session.scalar(
        select(func.count()).where(
            TinkerSession.tenant_id == tenant_id,
            TinkerSession.kind == "session",
            TinkerSession.finished_at.is_(None),
            TinkerSession.heartbeat_at > idle,
        )
    )
    limit = settings.tinker_max_open_sessions
    if (held or 0) >= limit:
        raise too_many(
            f"the tenant has {limit} open Tinker sessions; the limit is {limit} (finish one, "
            f"or let it go idle for {settings.tinker_session_idle_s:g}s)",
            settings.tinker_sessions_retry_after_s,
        )
    row = TinkerSession(id=new_id("tks"), tenant_id=tenant_id, kind="session")
    session.add(row)
    session.flush()
    return row.id


def get_session(session: Session, tenant_id: str, session_id: str, kind: str) -> TinkerSession:
    row = session.get(TinkerSession, session_id) if _comparable(session_id) else None
    if row is None or row.tenant_id != tenant_id or row.kind != kind:
        raise missing("sampling session" if kind == "sampler" else "session", session_id)
    return row


def gone(session_id: str) -> ProblemError:
    """410 for a request in a finished session (the SDK raises it as an APIStatusError, and
    never retries it); its saved weights and earlier futures stay readable."""
    return ProblemError(410, "Gone", f"session '{session_id}' has finished: it takes no more "
                        "requests (start a new ServiceClient)")  # fmt: skip


def open_session(session: Session, tenant_id: str, session_id: str) -> TinkerSession:
    """The tenant's session, unless finished (410)."""
    row = get_session(session, tenant_id, session_id, "session")
    if row.finished_at is not None:
        raise gone(session_id)
    return row


def _refuse_finished(session: Session, session_id: str | None) -> None:
    parent = session.get(TinkerSession, session_id) if session_id else None
    if parent is not None and parent.finished_at is not None:
        raise gone(parent.id)


def heartbeat(session: Session, tenant_id: str, session_id: str) -> None:
    """A finished session's heartbeat is a 410: the SDK stops its heartbeat loop on it."""
    open_session(session, tenant_id, session_id).heartbeat_at = utcnow()


def finish_session(session: Session, tenant_id: str, session_id: str) -> None:
    row = get_session(session, tenant_id, session_id, "session")
    row.finished_at = row.finished_at or utcnow()


# The catalog


def catalog_model(session: Session, name: str, field: str = "base_model") -> CatalogModel:
    row = session.get(CatalogModel, name) if name else None
    if row is None:
        raise bad_request(field, f"unknown model '{name}' (see get_server_capabilities)")
    return row


def capabilities(session: Session) -> schemas.Capabilities:
    rows = session.scalars(select(CatalogModel).order_by(CatalogModel.name))
    return schemas.Capabilities(
        supported_models=[
            schemas.SupportedModel(model_name=m.name, max_context_length=m.context_length)
            for m in rows
        ]
    )


# Training runs


def create_run(session: Session, tenant_id: str, body: schemas.CreateModelIn) -> TinkerRun:
    open_session(session, tenant_id, body.session_id)
    catalog_model(session, body.base_model)
    lora = body.lora_config or schemas.LoraConfigIn(rank=32)
    check_lora(lora)
    if body.optimizer_config.type != "adamw":
        raise bad_request("optimizer_config.type", "only 'adamw' is supported")
    refuse_over_budget(session, tenant_id)
    run_id = f"{body.session_id}:train:{body.model_seq_id}"  # as the SDK derives it too
    if session.get(TinkerRun, run_id) is not None:
        raise ProblemError(409, "Conflict", f"training run '{run_id}' exists")
    run = TinkerRun(
        id=run_id,
        tenant_id=tenant_id,
        session_id=body.session_id,
        base_model=body.base_model,
        lora_rank=lora.rank,
        lora_config=lora.model_dump() | {"seed": lora.seed or 0},
        user_metadata=_strings(body.user_metadata),
    )
    session.add(run)
    session.flush()
    return run


def check_lora(lora: schemas.LoraConfigIn) -> None:
    """What the engine refuses of a LoRA config the API can see without the model's layers."""
    if not 1 <= lora.rank <= MAX_LORA_RANK:
        raise bad_request("lora_config.rank", f"must be between 1 and {MAX_LORA_RANK}")
    if not (lora.train_mlp or lora.train_attn or lora.train_unembed):
        raise bad_request("lora_config", "train_mlp, train_attn or train_unembed must be true")


def get_run(session: Session, tenant_id: str, run_id: str) -> TinkerRun:
    run = session.get(TinkerRun, run_id) if _comparable(run_id) else None
    if run is None or run.tenant_id != tenant_id:
        raise missing("training run", run_id)
    return run


def live_run(session: Session, tenant_id: str, run_id: str) -> TinkerRun:
    """The tenant's run, to queue a request on: not in a finished session (410)."""
    run = get_run(session, tenant_id, run_id)
    _refuse_finished(session, run.session_id)
    return run


def run_info(session: Session, run: TinkerRun) -> dict[str, Any]:
    model = session.get(CatalogModel, run.base_model)
    return {
        "type": "get_info",
        "model_id": run.id,
        "model_name": run.base_model,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "model_data": {
            "arch": model.architecture if model else None,
            "model_name": run.base_model,
            # the worker's weights: a Hub id, or a directory (the SDK's get_tokenizer loads it)
            "tokenizer_id": model.source if model else None,
        },
    }


def list_runs(
    session: Session, tenant_id: str, limit: int, offset: int
) -> schemas.TrainingRunsList:
    where = TinkerRun.tenant_id == tenant_id
    total = session.scalar(select(func.count()).select_from(TinkerRun).where(where)) or 0
    runs = session.scalars(
        select(TinkerRun).where(where).order_by(TinkerRun.id.desc()).limit(limit).offset(offset)
    )
    return schemas.TrainingRunsList(
        training_runs=[run_out(session, r) for r in runs],
        cursor=schemas.Cursor(offset=offset, limit=limit, total_count=total),
    )


def run_out(session: Session, run: TinkerRun) -> schemas.TrainingRunOut:
    def last(kind: str) -> schemas.CheckpointOut | None:
        row = session.scalars(
            select(TinkerCheckpoint)
            .where(
                TinkerCheckpoint.run_id == run.id,
                TinkerCheckpoint.kind == kind,
                TinkerCheckpoint.unexpired(),
            )
            .order_by(TinkerCheckpoint.created_at.desc())
            .limit(1)
        ).first()
        return checkpoint_out(row) if row else None

    return schemas.TrainingRunOut(
        training_run_id=run.id,
        base_model=run.base_model,
        model_owner=run.tenant_id,
        lora_rank=run.lora_rank,
        last_request_time=_iso(run.last_request_at),
        last_checkpoint=last("training"),
        last_sampler_checkpoint=last("sampler"),
        user_metadata=run.user_metadata,
    )


# Checkpoints and tinker:// paths


def tinker_path(run_id: str, kind: str, name: str) -> str:
    return f"tinker://{run_id}/{KIND_SEGMENT[kind]}/{name}"


def checkpoint_name(field: str, name: str | None, fallback: str) -> str:
    name = name or fallback
    if not (0 < len(name) <= 200) or "/" in name or name in (".", ".."):
        raise bad_request(field, "a name of 1 to 200 characters without '/'")
    return name


def parse_path(path: str, field: str = "path") -> tuple[str, str, str]:
    """tinker://<run>/<weights|sampler_weights>/<name> -> (run id, kind, name)."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in SEGMENT_KIND or not parts[0] or not parts[2]:
        raise bad_request(field, "not a tinker://<run>/weights|sampler_weights/<name> path")
    return parts[0], SEGMENT_KIND[parts[1]], parts[2]


def find_checkpoint(
    session: Session, tenant_id: str, path: str, kind: str | None = None, field: str = "path"
) -> TinkerCheckpoint:
    run_id, path_kind, name = parse_path(path, field)
    if kind is not None and path_kind != kind:
        raise bad_request(field, f"a {KIND_SEGMENT[kind]} path is needed here")
    if not _comparable(path):
        raise missing("checkpoint", path)
    row = session.scalars(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.run_id == run_id,
            TinkerCheckpoint.kind == path_kind,
            TinkerCheckpoint.name == name,
            TinkerCheckpoint.unexpired(),
        )
    ).first()
    if row is None or row.tenant_id != tenant_id:
        raise missing("checkpoint", path)
    return row


def find_sampler(session: Session, tenant_id: str, path: str) -> TinkerCheckpoint | None:
    """The tenant's sampler checkpoint at a tinker:// path; None for anything else, exactly as
    for a missing one (inference answers model_not_found)."""
    try:
        return find_checkpoint(session, tenant_id, path, "sampler")
    except ProblemError:
        return None


def checkpoint_out(row: TinkerCheckpoint) -> schemas.CheckpointOut:
    return schemas.CheckpointOut(
        checkpoint_id=f"{KIND_SEGMENT[row.kind]}/{row.name}",
        checkpoint_type=row.kind,
        time=_iso(row.created_at),
        tinker_path=tinker_path(row.run_id, row.kind, row.name),
        size_bytes=row.size_bytes,
        user_metadata=row.user_metadata,
        expires_at=_iso(row.expires_at) if row.expires_at else None,
    )


def list_checkpoints(session: Session, run: TinkerRun) -> schemas.CheckpointsList:
    rows = session.scalars(
        select(TinkerCheckpoint)
        .where(TinkerCheckpoint.run_id == run.id, TinkerCheckpoint.unexpired())
        .order_by(TinkerCheckpoint.created_at.desc())
    ).all()
    return schemas.CheckpointsList(checkpoints=[checkpoint_out(r) for r in rows])


def check_name_free(
    session: Session, run: TinkerRun, kind: str, name: str, overwrite: bool
) -> TinkerCheckpoint | None:
    """409 for a name the run holds already, unless `overwrite` (the SDK's save_state flag);
    an expired checkpoint's name is free. The row the save will replace, expired or not."""
    taken = session.scalars(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.run_id == run.id,
            TinkerCheckpoint.kind == kind,
            TinkerCheckpoint.name == name,
        )
    ).first()
    if taken is not None and not taken.is_expired() and not overwrite:
        path = tinker_path(run.id, kind, name)
        raise ProblemError(409, "Conflict", f"checkpoint '{path}' exists (overwrite=True)")
    return taken


# Sampling sessions


def create_sampler(
    session: Session, tenant_id: str, body: schemas.CreateSamplingSessionIn
) -> TinkerSession:
    open_session(session, tenant_id, body.session_id)
    if body.model_path:
        ckpt = find_checkpoint(session, tenant_id, body.model_path, "sampler", "model_path")
        base = get_run(session, tenant_id, ckpt.run_id).base_model
    else:
        base = catalog_model(session, body.base_model or "").name
    row = TinkerSession(
        id=new_id("tks"),
        tenant_id=tenant_id,
        kind="sampler",
        base_model=base,
        model_path=body.model_path,
        session_id=body.session_id,
    )
    session.add(row)
    session.flush()
    return row


def live_sampler(session: Session, tenant_id: str, sampler_id: str) -> TinkerSession:
    """The tenant's sampling session, to sample with: not in a finished session (410)."""
    row = get_session(session, tenant_id, sampler_id, "sampler")
    _refuse_finished(session, row.session_id)
    return row


def join_sampler(session: Session, tenant_id: str, sampler_id: str) -> int:
    row = live_sampler(session, tenant_id, sampler_id)
    row.clients += 1
    return row.clients


def _strings(values: dict[str, Any] | None) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in values.items()} if values else None


def _iso(value: datetime) -> str:
    return value.isoformat()


def no_such_route(what: str) -> ProblemError:
    """501 for a route of the Tinker API this server does not implement."""
    return ProblemError(
        501,
        "Not Implemented",
        f"{what} is not supported by this server (docs/tinker.md lists what is)",
    )
