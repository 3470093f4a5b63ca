"""Fairness between tenants on the inference routes (docs/inference.md#limits).

Two bounds, both checked before the backend is called:
- a token budget per request: the completion tokens it may ask the backend to decode, its cap
  times its choices (`max_tokens × n`, times the prompts of a `/v1/completions`), at most
  GRPO_INFERENCE_MAX_TOKENS_PER_REQUEST (422 naming the cap's field). A request without a cap
  decodes to the end of the model's context, which the backend bounds (the API does not know
  the context: such a request is not checked here);
- GRPO_INFERENCE_TENANT_CONCURRENCY requests of one tenant in flight in this process (a stream
  until it ends), GRPO_INFERENCE_CONCURRENCY of all tenants; beyond them a request waits in its
  tenant's queue (GRPO_INFERENCE_TENANT_QUEUE deep, GRPO_INFERENCE_QUEUE_WAIT_S long) and the
  freed slots go round the tenants (service/inference/scheduler.py), so one tenant's burst
  queues at its own door and never ahead of another tenant's request; beyond the queue, a 429
  with Retry-After.
"""

from __future__ import annotations

import asyncio
import weakref

from service.core.problems import FieldError, invalid
from service.inference.scheduler import FairScheduler, Limits
from service.inference.schemas import ChatCompletionRequest, CompletionRequest
from service.settings import Settings

# One scheduler per event loop (uvicorn runs one per process): its queues hold that loop's
# futures.
_schedulers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairScheduler] = (
    weakref.WeakKeyDictionary()
)


def inference_slots(settings: Settings) -> FairScheduler:
    """This event loop's scheduler, made with the settings of its first request."""
    loop = asyncio.get_running_loop()
    scheduler = _schedulers.get(loop)
    if scheduler is None:
        depth = settings.inference_tenant_queue
        limits = Limits(
            total=settings.inference_concurrency,
            per_tenant=settings.inference_tenant_concurrency,
            queue_depth=settings.inference_tenant_concurrency if depth is None else depth,
            wait_s=settings.inference_queue_wait_s,
        )
        scheduler = _schedulers[loop] = FairScheduler(limits)
    return scheduler


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
