"""What one Tinker request may ask of the worker: data, tokens per datum, tokens in all
(GRPO_TINKER_MAX_*; docs/tinker.md, "Limits and turns"). Refused at submission, before the
engine's own checks, with a 413 naming the limit, its setting and the field.

The caps bound how long one request holds the worker, and so how long another tenant's request
waits behind it (futures.claim_next gives the next turn to the tenant that used the least). The
SDK is told them (`client/config`): it splits a bigger forward / forward_backward into requests
within them and joins their results, so a caller never meets the data and total caps there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.core.problems import FieldError, ProblemError
from service.settings import Settings

# The SDK sizes its chunks by estimated bytes: 4 a token of the model input, plus each
# loss_fn_input's array; every loss needs target_tokens, which the SDK sends as int64. So a
# chunk of at most this many bytes a token holds at most the token cap.
SDK_BYTES_PER_TOKEN_AT_LEAST = 4 + 8


def too_large(field: str, message: str) -> ProblemError:
    """413, with the field's path as a 400 of ours gives it (`data[3].model_input`)."""
    return ProblemError(
        413,
        "Content Too Large",
        f"{field}: {message}",
        errors=[FieldError(path=field, message=message)],
    )


def check_data(data: Sequence[dict[str, Any]], settings: Settings) -> None:
    """A forward or forward_backward request's data (the decoded body's `data`)."""
    most = settings.tinker_max_data_per_request
    if len(data) > most:
        raise too_large("data", f"{len(data)} data, over the limit of {most} a request "
                        "(GRPO_TINKER_MAX_DATA_PER_REQUEST)")  # fmt: skip
    per_datum, total = settings.tinker_max_tokens_per_datum, 0
    for i, datum in enumerate(data):
        n = len(datum["tokens"])
        if n > per_datum:
            raise too_large(f"data[{i}].model_input", f"{n} tokens, over the limit of "
                            f"{per_datum} a datum (GRPO_TINKER_MAX_TOKENS_PER_DATUM)")  # fmt: skip
        total += n
    _check_total("data", f"{total} tokens in all", total, settings)


def check_sample(prompt: int, num_samples: int, max_tokens: int, settings: Settings) -> None:
    """A sample: each sequence is its prompt and up to `max_tokens` drawn tokens."""
    each = prompt + max_tokens
    if each > settings.tinker_max_tokens_per_datum:
        raise too_large(
            "sampling_params.max_tokens",
            f"the prompt's {prompt} tokens and max_tokens {max_tokens} make {each}, over the "
            f"limit of {settings.tinker_max_tokens_per_datum} a sequence "
            "(GRPO_TINKER_MAX_TOKENS_PER_DATUM)",
        )
    total = num_samples * each
    _check_total("num_samples", f"{num_samples} samples x {each} tokens = {total} tokens",
                 total, settings)  # fmt: skip


def _check_total(field: str, what: str, total: int, settings: Settings) -> None:
    most = settings.tinker_max_tokens_per_request
    if total > most:
        raise too_large(field, f"{what}, over the limit of {most} tokens a request "
                        "(GRPO_TINKER_MAX_TOKENS_PER_REQUEST)")  # fmt: skip


def sdk_chunking(settings: Settings) -> dict[str, int]:
    """The SDK's forward_backward chunking (its ClientConfigResponse) within the caps and the
    request body limit: at most the data cap a chunk, and bytes for at most the token cap."""
    by_tokens = settings.tinker_max_tokens_per_request * SDK_BYTES_PER_TOKEN_AT_LEAST
    return {
        "fwdbwd_max_chunk_len": settings.tinker_max_data_per_request,
        # half the body limit: the estimate leaves out the protobuf framing
        "fwdbwd_max_chunk_bytes_count": min(by_tokens, settings.max_request_bytes // 2),
    }
