"""Failed API-key attempts, counted per client address: past `auth_failure_limit` in a window
of `auth_failure_window_s`, the address gets 429 with Retry-After and its keys are not even
looked up, so guessing keys costs the database nothing more than the limit allows.

Per API process (each replica counts its own), on the event loop only (no lock). Behind a
proxy the address is the one uvicorn takes from `X-Forwarded-For`, which it trusts only from
`FORWARDED_ALLOW_IPS`. IPv6 clients are counted by their /64, the block one host usually
holds, so that a host cannot multiply its budget by rotating addresses.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from service.core.problems import too_many
from service.settings import Settings

# Addresses tracked at once: an attacker with many addresses can age out other entries, but
# never grow the table past this.
MAX_CLIENTS = 100_000


@dataclass
class _Window:
    started: float
    failures: int


def client_key(host: str | None) -> str:
    """The address a failure is counted against: an IPv6 /64, otherwise the host itself."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


class FailureThrottle:
    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        # Ordered by the start of each address's window: the oldest expire first.
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def retry_after(self, key: str, limit: int, window_s: float) -> int | None:
        """Seconds until `key` may try again, or None when it is not throttled."""
        window = self._windows.get(key)
        if window is None:
            return None
        left = window.started + window_s - time.monotonic()
        if left <= 0:
            del self._windows[key]
            return None
        return max(1, math.ceil(left)) if window.failures >= limit else None

    def failed(self, key: str, window_s: float) -> None:
        now = time.monotonic()
        window = self._windows.get(key)
        if window is None or window.started + window_s <= now:
            self._windows.pop(key, None)
            self._windows[key] = _Window(now, 1)
            self._trim(now, window_s)
        else:
            window.failures += 1

    def _trim(self, now: float, window_s: float) -> None:
        while self._windows:
            oldest = next(iter(self._windows.values()))
            if oldest.started + window_s > now and len(self._windows) <= self.max_clients:
                return
            self._windows.popitem(last=False)


failed_auth = FailureThrottle()


def admit_client(host: str | None, settings: Settings, what: str) -> str:
    """The client's throttle key, or a 429 (with Retry-After) while its recent failed
    attempts are over the limit; the caller reports a failure with `failed_auth.failed`."""
    client = client_key(host)
    wait = failed_auth.retry_after(
        client, settings.auth_failure_limit, settings.auth_failure_window_s
    )
    if wait is not None:
        raise too_many(f"too many failed {what} from this address", wait)
    return client
