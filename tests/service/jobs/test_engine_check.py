"""`grpo.engine: paged` on a model family continuous batching does not serve is refused at
submission, naming the field; other engines, and paged on a served family, pass."""

from __future__ import annotations

import pytest

from service.jobs.model_checks import check_engine
from service.jobs.schemas import JobCreate
from service.models import CatalogModel


def _body(engine: str | None) -> JobCreate:
    return JobCreate.model_validate(
        {"base_model": "m", "dataset": "ds_1", "verifiers": [{"name": "em"}], "queue": "gpu",
         "grpo": {"engine": engine}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "model_type", "refused"),
    [("paged", "gpt2", True), ("paged", "qwen2", False), ("paged", "llama", False),
     ("fast", "gpt2", False), ("auto", "gpt2", False), (None, "gpt2", False)],
)  # fmt: skip
def test_paged_needs_a_served_family(engine: str | None, model_type: str, refused: bool) -> None:
    errors = check_engine(_body(engine), CatalogModel(name="m", model_type=model_type))
    assert [e.path for e in errors] == (["$.grpo.engine"] if refused else [])
    if refused:
        assert "'gpt2'" in errors[0].message and "llama" in errors[0].message
