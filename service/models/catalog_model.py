from datetime import datetime

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class CatalogModel(Base):
    """A base model the operator registered (`grpo-service models add NAME SOURCE`): tenants
    name it in `base_model`; workers load it from `source` pinned at `revision`."""

    __tablename__ = "catalog_models"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    source: Mapped[str] = mapped_column(String(1000))  # a worker-local directory or a Hub id
    source_kind: Mapped[str] = mapped_column(String(16))  # "local" | "hub"
    revision: Mapped[str] = mapped_column(String(64))  # Hub commit sha, or sha256 of the files
    architecture: Mapped[str] = mapped_column(String(200))
    model_type: Mapped[str] = mapped_column(String(100))
    num_parameters: Mapped[int] = mapped_column(BigInteger)
    context_length: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    # What the API checks a spec against without loading the model.
    hidden_size: Mapped[int] = mapped_column(Integer)
    num_layers: Mapped[int] = mapped_column(Integer)
    vocab_size: Mapped[int] = mapped_column(Integer)
    intermediate_size: Mapped[int] = mapped_column(Integer)
    kv_dim: Mapped[int] = mapped_column(Integer)
    lora_targets: Mapped[dict] = mapped_column(default=dict)  # module -> {in, out, kind}
    chat_template: Mapped[str | None] = mapped_column(Text, default=None)
    tokenizer_key: Mapped[str | None] = mapped_column(String(500), default=None)
    special_tokens: Mapped[dict] = mapped_column(default=dict)  # bos/eos for the template
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    @property
    def is_hub(self) -> bool:
        return self.source_kind == "hub"
