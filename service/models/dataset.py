from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class Dataset(Base):
    """A validated JSONL dataset; the records live in object storage under `object_key`."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    num_records: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    object_key: Mapped[str] = mapped_column(String(500))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)  # of the JSONL
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # For the checks at submission: whether any prompt is chat messages, and the longest
    # prompt in tokens per model (`{"chat": bool, "tokens": {"name@revision": n}}`), filled
    # the first time a job names the pair; the first records' field names (`"fields"`), the
    # first time a job's verifiers need one (`service.jobs.field_checks`).
    prompt_stats: Mapped[dict] = mapped_column(default=dict)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    # Set when the dataset was uploaded as an OpenAI file (POST /v1/files): `fine-tune`.
    purpose: Mapped[str | None] = mapped_column(String(32), default=None)
