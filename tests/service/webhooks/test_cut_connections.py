"""An attempt cut by its deadline closes its connection at once, wherever it was cut: in the
middle of a TLS handshake (a socket httpcore leaves to us: `dispatcher.UnownedStream`) or
while waiting for the answer. Left to the garbage collector, a hostile receiver that never
answers would hold a file descriptor of ours per attempt."""

from __future__ import annotations

import gc
import time
from datetime import UTC, datetime

import anyio
import httpx
import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from service.secrets import crypto
from service.settings import Settings
from service.webhooks import dispatcher
from service.webhooks.claims import Attempt
from service.webhooks.service import secret_name
from tests.e2e.webhook_receiver import Silent, silent_receiver

DEADLINE_S = 0.3
SETTINGS = Settings(
    webhook_allow_private=True,
    webhook_timeout_s=DEADLINE_S,
    webhook_connect_timeout_s=0.2,
    secrets_key=SecretStr(Fernet.generate_key().decode()),
)


def _attempt(url: str) -> Attempt:
    tenant, hook = "ten_cut", "wh_cut"
    sealed = crypto.encrypt(SETTINGS, tenant, secret_name(hook), "whsec_test")
    return Attempt(delivery_id="msg_cut", number=1, created_at=datetime.now(UTC), body="{}",
                   url=url, tenant_id=tenant, webhook_id=hook, sealed_secret=sealed)  # fmt: skip


async def _closed_while_the_loop_runs(silent: Silent, timeout: float) -> float:
    """Seconds until the receiver saw every connection closed; the collector off meanwhile, and
    the event loop free to run the transports' closing callbacks."""
    start = time.monotonic()
    gc.disable()
    try:
        while silent.open_connections():
            assert time.monotonic() - start < timeout, "a cut connection is still open"
            await anyio.sleep(0.02)
    finally:
        gc.enable()
    return time.monotonic() - start


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_cut_attempt_closes_its_connection_itself(scheme: str) -> None:
    with silent_receiver() as silent:

        async def attempt_and_wait() -> tuple[dispatcher.Outcome, float]:
            # httpx's connect timeout far past the deadline: the deadline, not httpx, cuts the
            # handshake, as it may on a loaded machine with the real settings.
            async with httpx.AsyncClient(timeout=httpx.Timeout(30)) as http:
                url = f"{scheme}://127.0.0.1:{silent.port}/hook"
                outcome = await dispatcher.send(http, SETTINGS, _attempt(url))
                return outcome, await _closed_while_the_loop_runs(silent, 5)

        outcome, closed_after = anyio.run(attempt_and_wait)
        assert outcome == dispatcher.Outcome(None, f"no answer within {DEADLINE_S:g} s")
        assert silent.accepted == 1
        assert closed_after < 5
