"""`/v1/models`, OpenAI-shaped (`{object: "list", data: [{id, object: "model", created,
owned_by, ...}]}`), with what a user needs to choose a base."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.models import CatalogModel, Checkpoint, Job

CATALOG_OWNER = "system"


def _unix(value: datetime) -> int:
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


class ModelOut(BaseModel):
    id: str = Field(description="What `base_model` takes: a catalog name or a checkpoint id.")
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time.")
    owned_by: str = Field(description="`system` for the catalog, your tenant id for your own.")
    kind: Literal["base", "checkpoint", "fine_tuned"]
    root: str = Field(description="The catalog model under the weights.")
    parent: str | None = Field(None, description="A checkpoint's parent: its job's base_model.")
    architecture: str
    num_parameters: int
    context_length: int
    chat_template: bool = Field(description="Chat-message prompts can be rendered.")
    dtype: str | None = None
    revision: str | None = Field(None, description="Hub commit, or sha256 of the files.")
    size_bytes: int
    job: str | None = Field(None, description="The job that wrote the checkpoint.")
    step: int | None = None
    format: Literal["full", "peft-adapter"] | None = None
    final: bool | None = Field(None, description="The checkpoint of the job's last step.")

    @classmethod
    def of_catalog(cls, row: CatalogModel) -> ModelOut:
        return cls(
            id=row.name,
            created=_unix(row.created_at),
            owned_by=CATALOG_OWNER,
            kind="base",
            root=row.name,
            architecture=row.architecture,
            num_parameters=row.num_parameters,
            context_length=row.context_length,
            chat_template=row.has_chat_template,
            dtype=row.dtype,
            revision=row.revision,
            size_bytes=row.size_bytes,
        )

    @classmethod
    def of_checkpoint(cls, ckpt: Checkpoint, job: Job, root: CatalogModel | None) -> ModelOut:
        return cls(
            id=ckpt.id,
            created=_unix(ckpt.created_at),
            owned_by=job.tenant_id,
            kind="checkpoint",
            root=job.base_model or "",
            parent=job.spec.get("base_model"),
            architecture=root.architecture if root else "",
            num_parameters=root.num_parameters if root else 0,
            context_length=root.context_length if root else 0,
            chat_template=root.has_chat_template if root else False,
            size_bytes=ckpt.size_bytes,
            job=job.id,
            step=ckpt.step,
            format=ckpt.format,
            final=ckpt.step == job.total_steps,
        )

    @classmethod
    def of_fine_tuned(
        cls, name: str, ckpt: Checkpoint, job: Job, root: CatalogModel | None
    ) -> ModelOut:
        """A succeeded fine-tuning job's model (`ft:…`): its final checkpoint, by its name."""
        return cls.of_checkpoint(ckpt, job, root).model_copy(
            update={"id": name, "kind": "fine_tuned"}
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]
