"""Fairness between tenants on the inference routes (docs/inference.md#limits).

Two bounds, both checked before the backend is called:
- a token budget per request: the completion tokens it may ask the backend to decode, its cap
  times its choices (`max_tokens × n`, times the prompts of a `/v1/completions`), at most
  GRPO_INFERENCE_MAX_TOKENS_PER_REQUEST (422 naming the cap's field). A request without a cap
  decodes to the end of the model's context, which the backend bounds (the API does not know
  the context: such a request is not checked here);
- GRPO_INFERENCE_TENANT_CONCURRENCY requests of one tenant in flight in this process (a stream
  until it ends); beyond it a 429 with Retry-After, so one tenant's burst queues at its own
  door and never ahead of another tenant's request in the backend's batches.
"""

from __future__ import annotations

from service.core.problems import FieldError, invalid
from service.http.limits import PerTenantSlots
from service.inference.schemas import ChatCompletionRequest, CompletionRequest
from service.settings import Settings

inference_slots = PerTenantSlots()


def _cap_field(body: ChatCompletionRequest | CompletionRequest) -> tuple[str, int | None]:
    """The field that caps the completion's length, and its value (None: unset)."""
    if isinstance(body, CompletionRequest):
        return "max_tokens", body.max_tokens
    if body.max_completion_tokens is not None or body.max_tokens is None:
        return "max_completion_tokens", body.max_completion_tokens
    return "max_tokens", body.max_tokens


def check_token_budget(body: ChatCompletionRequest | CompletionRequest, settings: Settings) -> None:
    """422 naming the cap's field when the cap times the choices is over the budget."""
    limit = settings.inference_max_tokens_per_request
    choices = body.n * (len(body.prompts()) if isinstance(body, CompletionRequest) else 1)
    field, cap = _cap_field(body)
    if cap is not None and cap * choices > limit:
        times = "n × prompts" if choices != body.n else "n"
        message = (
            f"{field} × {times} = {cap} × {choices} = {cap * choices} completion tokens is over "
            f"the limit of {limit} per request: ask for fewer tokens or fewer choices"
        )
        raise invalid([FieldError(path=f"$.{field}", message=message)])
