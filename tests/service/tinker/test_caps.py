"""What one Tinker request may ask (service/tinker/caps.py): over a cap is a 413 naming the
field, the limit and its setting; the SDK is told chunk sizes that keep its requests within
them. Through the SDK and a real server: tests/e2e/test_tinker_fairness.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.core.problems import ProblemError
from service.settings import Settings
from service.tinker import caps

SETTINGS = Settings(
    tinker_max_data_per_request=4,
    tinker_max_tokens_per_datum=10,
    tinker_max_tokens_per_request=25,
    max_request_bytes=1 << 20,
)


def data(*lengths: int) -> list[dict[str, Any]]:
    return [{"tokens": [5] * n, "loss_fn_inputs": {}} for n in lengths]


def refused(call: Callable[[], None]) -> tuple[str, str]:
    """The field a 413 names, and its message."""
    with pytest.raises(ProblemError) as err:
        call()
    problem = err.value.problem
    assert (problem.status, problem.title) == (413, "Content Too Large")
    assert problem.errors is not None and len(problem.errors) == 1
    assert problem.detail == f"{problem.errors[0].path}: {problem.errors[0].message}"
    return problem.errors[0].path, problem.errors[0].message


def test_requests_within_the_caps_pass() -> None:
    caps.check_data(data(10, 10, 5), SETTINGS)  # 25 tokens, 3 data
    caps.check_data(data(1, 1, 1, 1), SETTINGS)
    caps.check_sample(prompt=3, num_samples=3, max_tokens=5, settings=SETTINGS)  # 3 x 8 = 24


def test_each_cap_is_refused_naming_its_field_and_limit() -> None:
    assert refused(lambda: caps.check_data(data(1, 1, 1, 1, 1), SETTINGS)) == (
        "data",
        "5 data, over the limit of 4 a request (GRPO_TINKER_MAX_DATA_PER_REQUEST)",
    )
    assert refused(lambda: caps.check_data(data(3, 11), SETTINGS)) == (
        "data[1].model_input",
        "11 tokens, over the limit of 10 a datum (GRPO_TINKER_MAX_TOKENS_PER_DATUM)",
    )
    assert refused(lambda: caps.check_data(data(10, 10, 6), SETTINGS)) == (
        "data",
        "26 tokens in all, over the limit of 25 tokens a request "
        "(GRPO_TINKER_MAX_TOKENS_PER_REQUEST)",
    )
    field, message = refused(lambda: caps.check_sample(3, 1, 8, SETTINGS))
    assert field == "sampling_params.max_tokens"
    assert "make 11, over the limit of 10" in message and "MAX_TOKENS_PER_DATUM" in message
    assert refused(lambda: caps.check_sample(3, 4, 4, SETTINGS)) == (
        "num_samples",
        "4 samples x 7 tokens = 28 tokens, over the limit of 25 tokens a request "
        "(GRPO_TINKER_MAX_TOKENS_PER_REQUEST)",
    )


def test_the_sdk_is_told_chunks_within_the_caps_and_the_body_limit() -> None:
    assert caps.sdk_chunking(SETTINGS) == {
        "fwdbwd_max_chunk_len": 4,
        "fwdbwd_max_chunk_bytes_count": 25 * 12,  # target_tokens' 8 bytes + the token's 4
    }
    small_body = SETTINGS.model_copy(update={"max_request_bytes": 200})
    assert caps.sdk_chunking(small_body)["fwdbwd_max_chunk_bytes_count"] == 100
