"""Which models the `paged` engine (transformers' continuous batching, `paged.py`) serves.

Torch-free, so that the API refuses `grpo.engine: paged` on a model it cannot serve at
submission (a 422 naming the field, `service.jobs.model_checks.check_engine`) from the catalog's
`model_type`, and the worker refuses the same models when it chooses the backend.

The list is the decoder-only families whose continuous-batching decode the tests pin to the
reference path (`tests/workers/grpo/test_paged.py`): attention through transformers' attention
interface, full-attention layers only, a plain KV cache. Other families may work too; they are
added here once a test decodes them.
"""

from __future__ import annotations

PAGED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def paged_refusal(model_type: str) -> str | None:
    """Why the paged engine cannot serve a model of `model_type`, or None when it can."""
    if model_type in PAGED_MODEL_TYPES:
        return None
    served = ", ".join(PAGED_MODEL_TYPES)
    return (
        f"the paged engine (transformers' continuous batching) serves {served} models, not"
        f" {model_type!r}: use engine fast, reference or auto"
    )
