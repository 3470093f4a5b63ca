"""A fair queue in front of the inference backend (issue 34 item 8).

Why: the backend serves what reaches it first come first served, so whoever sends the most
requests is served the most: one tenant's long concurrent completions kept another tenant's
short request waiting for minutes (bench/README.md, "Figures behind design choices").
Refusing a tenant's requests beyond its slots at once (a 429) bounds that, but turns every
short burst into errors.

So each API process lets at most `total` requests reach the backend, at most `per_tenant` of
one tenant. A request beyond either waits in its tenant's own queue (at most `queue_depth`
requests, for at most `wait_s`); each slot that frees goes to the head of the queue of the
waiting tenant with the fewest requests running, ties in round-robin order (a tenant just
served goes to the back). One tenant's backlog therefore never sits ahead of another tenant's
single request. Beyond the queue's depth or its wait: 429 with Retry-After.

Pure asyncio on one event loop (uvicorn runs one per process): every change of state happens
between two awaits, so there is no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from service.core.problems import ProblemError, too_many

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Limits:
    total: int  # requests of all tenants in flight at once
    per_tenant: int  # requests of one tenant in flight at once
    queue_depth: int  # requests of one tenant waiting for a slot (0: no queue)
    wait_s: float  # the longest wait for a slot


class FairScheduler:
    """Slots for inference requests: `await acquire(tenant)`, then `release(tenant)` once the
    answer (or its stream) has ended."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._running: dict[str, int] = {}
        self._total = 0
        # The tenants with requests waiting, in round-robin order (a dict keeps insertion
        # order: a tenant served is popped and, with more waiting, put back last).
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def waiting(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))

    async def acquire(self, tenant: str) -> None:
        """A slot for one of the tenant's requests, at once or at its turn in the queue. 429
        when the tenant's queue is full or its turn does not come within `wait_s`."""
        # Whoever waits is blocked by a limit (a freed slot is handed on at once), so a tenant
        # with a free slot and no request of its own waiting jumps no one's turn.
        if not self.waiting(tenant) and self._free(tenant):
            self._start(tenant)
            return
        if self.waiting(tenant) >= self.limits.queue_depth:
            raise self._refusal(
                tenant,
                f" and {self.waiting(tenant)} waiting; the limits are {self.limits.per_tenant} "
                f"running and {self.limits.queue_depth} waiting",
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(turn)
        try:
            # `wait` never cancels `turn`: a slot handed over as the wait ends is still seen
            await asyncio.wait([turn], timeout=self.limits.wait_s)
        except BaseException:  # the request was cancelled while it waited
            self._leave(tenant, turn)
            raise
        if not turn.done():
            self._leave(tenant, turn)
            raise self._refusal(
                tenant,
                f" and no slot came free within {self.limits.wait_s:g} s; the limits are "
                f"{self.limits.per_tenant} for this tenant and {self.limits.total} for all tenants",
            )

    def release(self, tenant: str) -> None:
        """Give back a slot `acquire` gave: it goes to the next waiting request in turn."""
        self._running[tenant] -= 1
        if not self._running[tenant]:
            del self._running[tenant]
        self._total -= 1
        self._dispatch()

    def _free(self, tenant: str) -> bool:
        return self._total < self.limits.total and self.running(tenant) < self.limits.per_tenant

    def _start(self, tenant: str) -> None:
        self._running[tenant] = self.running(tenant) + 1
        self._total += 1

    def _dispatch(self) -> None:
        """Hand the free slots to waiting requests, one at a time, fairly (the module's
        docstring)."""
        while self._total < self.limits.total:
            ready = [t for t in self._waiting if self.running(t) < self.limits.per_tenant]
            if not ready:
                return
            tenant = min(ready, key=self.running)  # the first of the fewest: round-robin ties
            queue = self._waiting.pop(tenant)
            turn = queue.popleft()
            if queue:
                self._waiting[tenant] = queue  # to the back of the round
            self._start(tenant)
            turn.set_result(None)

    def _leave(self, tenant: str, turn: asyncio.Future[None]) -> None:
        """A waiter that gives up: out of the queue, or its slot given back if it had one."""
        if turn.done():
            self.release(tenant)
            return
        queue = self._waiting[tenant]
        queue.remove(turn)
        if not queue:
            del self._waiting[tenant]

    def _refusal(self, tenant: str, why: str) -> ProblemError:
        running = self.running(tenant)
        return too_many(f"{running} inference requests running for this tenant{why}", RETRY_AFTER_S)
