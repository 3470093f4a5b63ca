"""The model catalog: operators add and remove base models; tenants read it and name its
entries (or checkpoints of their own) as `base_model`."""

from __future__ import annotations

import re

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.catalog.facts import ModelFacts
from service.core.problems import model_not_found
from service.core.suggest import MAX_NAMES
from service.core.text import text_problem
from service.models import UNFINISHED_STATUSES, CatalogModel, Checkpoint, Job
from service.storage import ObjectStorage

# A name is never a path: no leading slash or dot, no "..", no scheme, no backslash.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
MAX_NAME = 100


class CatalogError(ValueError):
    """An operator's catalog command that cannot be carried out; the message says why."""


def valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(NAME.match(name)) and ".." not in name


def add_model(
    session: Session, storage: ObjectStorage, name: str, source: str, facts: ModelFacts
) -> CatalogModel:
    if not valid_name(name):
        raise CatalogError(
            f"{name!r} is not a model name: letters, digits, '_', '.', '-', at most one '/', "
            f"{MAX_NAME} characters at most"
        )
    if session.get(CatalogModel, name) is not None:
        raise CatalogError(f"the catalog already has {name!r}: remove it first")
    tokenizer_key = None
    if facts.tokenizer_json is not None:  # for the API's prompt-length check, without torch
        tokenizer_key = f"catalog/{name}/{facts.revision}/tokenizer.json"
        storage.put_bytes(tokenizer_key, facts.tokenizer_json.encode())
    row = CatalogModel(
        name=name,
        source=source if facts.source_kind == "hub" else str(facts.path),
        source_kind=facts.source_kind,
        revision=facts.revision,
        architecture=facts.architecture,
        model_type=facts.model_type,
        num_parameters=facts.num_parameters,
        context_length=facts.context_length,
        dtype=facts.dtype,
        size_bytes=facts.size_bytes,
        hidden_size=facts.hidden_size,
        num_layers=facts.num_layers,
        vocab_size=facts.vocab_size,
        intermediate_size=facts.intermediate_size,
        kv_dim=facts.kv_dim,
        lora_targets=facts.lora_targets,
        chat_template=facts.chat_template,
        tokenizer_key=tokenizer_key,
        special_tokens=facts.special_tokens,
    )
    session.add(row)
    session.flush()
    return row


def remove_model(session: Session, name: str) -> None:
    """Finished jobs keep their record of the name; a live job still needs the weights."""
    row = session.get(CatalogModel, name)
    if row is None:
        raise CatalogError(f"the catalog has no {name!r}")
    live = session.scalar(
        select(Job.id).where(Job.base_model == name, Job.status.in_(UNFINISHED_STATUSES)).limit(1)
    )
    if live:
        raise CatalogError(f"{name!r} is the base of live job {live}: cancel it or wait")
    session.delete(row)
    session.flush()


def list_models(session: Session) -> list[CatalogModel]:
    return list(session.scalars(select(CatalogModel).order_by(CatalogModel.name)))


def model_names(session: Session) -> list[str]:
    return list(session.scalars(select(CatalogModel.name).limit(MAX_NAMES)))


# Built once, with a bound parameter (`session.get` builds its statement at every call).
_FIND_MODEL = select(CatalogModel).where(CatalogModel.name == bindparam("name"))


def find_model(session: Session, name: str) -> CatalogModel | None:
    return session.scalar(_FIND_MODEL, {"name": name}) if valid_name(name) else None


def find_tenant_checkpoint(
    session: Session, tenant_id: str, checkpoint_id: str
) -> tuple[Checkpoint, Job] | None:
    """The checkpoint with its job, when the job is this tenant's; None exactly as for a
    missing id otherwise, and for an id the database cannot even compare (a NUL character:
    PostgreSQL refuses it in any text parameter)."""
    if text_problem(checkpoint_id) is not None:
        return None
    row = session.execute(
        select(Checkpoint, Job)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Job.tenant_id == tenant_id)
    ).first()
    return None if row is None else (row[0], row[1])


def tenant_checkpoints(
    session: Session, tenant_id: str, limit: int
) -> list[tuple[Checkpoint, Job]]:
    """The tenant's checkpoints, newest first (every one can be a base)."""
    rows = session.execute(
        select(Checkpoint, Job)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.tenant_id == tenant_id)
        .order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())
        .limit(limit)
    )
    return [(c, j) for c, j in rows]


def get_model(session: Session, name: str) -> CatalogModel:
    row = find_model(session, name)
    if row is None:
        raise model_not_found(name)
    return row
