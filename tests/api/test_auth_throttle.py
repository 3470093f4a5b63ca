"""Failed API key attempts are throttled per client address (429 with Retry-After, the keys of
a throttled address not even looked up), and cannot flush the auth cache: invalid keys are
never cached, and the cache holds at most GRPO_AUTH_CACHE_ENTRIES valid ones, least recently
used evicted first. Before, every guess cost a database lookup and was cached itself, and the
10,001st distinct guess cleared every cached key at once.

On an API of their own (the shared ones all see one address, 127.0.0.1). Client addresses are
set with X-Forwarded-For, which uvicorn trusts from 127.0.0.1 as it would from a proxy."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.helpers import problem
from tests.api.server import run_api
from tests.e2e.services import RunningService

LIMIT, WINDOW_S, CACHE_ENTRIES = 5, 3, 3


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    env = {
        "GRPO_AUTH_FAILURE_LIMIT": str(LIMIT),
        "GRPO_AUTH_FAILURE_WINDOW_S": str(WINDOW_S),
        "GRPO_AUTH_CACHE_S": "120",  # entries outlive the test: what leaves the cache was evicted
        "GRPO_AUTH_CACHE_ENTRIES": str(CACHE_ENTRIES),
    }
    with run_api(env, tmp_path_factory.mktemp("auth-throttle")) as running:
        yield running


def _get(svc: RunningService, key: str, address: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if address:
        headers["X-Forwarded-For"] = address
    return httpx.get(f"{svc.base_url}/v1/jobs", headers=headers, timeout=30)


def test_failed_attempts_are_throttled_per_address(svc: RunningService) -> None:
    attacker, neighbour = "203.0.113.7", "198.51.100.9"
    # Made first: two CLI runs can outlast the 3 s window on a loaded machine.
    first, second = svc.new_key("throttle-a"), svc.new_key("throttle-b")
    codes = [_get(svc, f"grpo_sk_guess{i}", attacker).status_code for i in range(LIMIT + 3)]
    assert codes == [401] * LIMIT + [429] * 3
    refused = _get(svc, "grpo_sk_guess-more", attacker)
    body = problem(refused, 429)
    assert "failed API key attempts" in body["detail"]
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
    # A valid key that is not cached is not looked up for a throttled address either.
    assert _get(svc, first, attacker).status_code == 429
    # Other addresses are not affected; an IPv6 host is counted by its /64.
    assert _get(svc, first, neighbour).status_code == 200
    assert _get(svc, "grpo_sk_guess", neighbour).status_code == 401
    for i in range(LIMIT):
        assert _get(svc, f"grpo_sk_v6-{i}", f"2001:db8:1:2::{i + 1}").status_code == 401
    assert _get(svc, "grpo_sk_v6", "2001:db8:1:2::ffff").status_code == 429  # same /64
    assert _get(svc, "grpo_sk_v6", "2001:db8:1:3::1").status_code == 401  # the next /64
    # After the window the address is served again.
    time.sleep(int(refused.headers["retry-after"]) + 0.2)
    assert _get(svc, second, attacker).status_code == 200


def test_invalid_keys_cannot_evict_valid_ones(svc: RunningService) -> None:
    keys = [svc.new_key(f"cached-{i}") for i in range(CACHE_ENTRIES + 1)]
    for key in keys:
        assert _get(svc, key).status_code == 200  # looked up and cached; keys[0] evicted last
    for key in keys:  # revoked: a key that still answers 200 was answered from the cache
        svc.cli("revoke-api-key", key)
    for i in range(200):  # a flood of guesses from many addresses, none of them throttled
        address = f"10.77.{i // 200}.{i % 200 + 1}"
        assert _get(svc, f"grpo_sk_flood{i}", address).status_code == 401
    assert _get(svc, keys[0]).status_code == 401  # the least recently used entry: evicted
    for key in keys[1:]:
        assert _get(svc, key).status_code == 200  # still cached: the flood evicted nothing
