"""The fair queue in front of the inference backend (service/inference/scheduler.py, issue 34
item 8), on a real event loop: a tenant beyond its slots and its queue is refused with
Retry-After, a queued request is served once a slot frees or refused after the wait, and the
freed slots go to another tenant's request before the first tenant's backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from service.core.problems import ProblemError
from service.inference.scheduler import FairScheduler, Limits


async def settle() -> None:
    """Let every task that can run, run (a handful of loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=10))


class Requests:
    """Requests through one scheduler, each a task that records its name once it has a slot."""

    def __init__(self, limits: Limits) -> None:
        self.scheduler = FairScheduler(limits)
        self.served: list[str] = []

    async def _one(self, tenant: str, name: str) -> None:
        await self.scheduler.acquire(tenant)
        self.served.append(name)

    async def send(self, tenant: str, *names: str) -> list[asyncio.Task[None]]:
        """Each request sent (in order) and waiting or served by the time this returns."""
        tasks = []
        for name in names:
            tasks.append(asyncio.create_task(self._one(tenant, name)))
            await settle()
        return tasks


def test_beyond_its_queue_a_tenant_is_refused_and_a_queued_request_is_served_later() -> None:
    async def test() -> None:
        requests = Requests(Limits(total=8, per_tenant=2, queue_depth=1, wait_s=5))
        scheduler = requests.scheduler
        await requests.send("a", "a1", "a2", "a3")
        assert requests.served == ["a1", "a2"] and scheduler.waiting("a") == 1
        with pytest.raises(ProblemError) as refused:
            await scheduler.acquire("a")
        assert refused.value.problem.status == 429
        assert refused.value.headers == {"Retry-After": "1"}
        assert "2 running and 1 waiting" in refused.value.problem.detail
        await requests.send("b", "b1")  # another tenant's slots are its own
        assert requests.served == ["a1", "a2", "b1"]
        scheduler.release("a")
        await settle()
        assert requests.served[-1] == "a3" and scheduler.running("a") == 2
        assert scheduler.waiting("a") == 0

    run(test)


def test_a_queued_request_waits_at_most_wait_s_then_is_refused() -> None:
    async def test() -> None:
        requests = Requests(Limits(total=8, per_tenant=1, queue_depth=4, wait_s=0.05))
        await requests.send("a", "a1")
        started = asyncio.get_running_loop().time()
        with pytest.raises(ProblemError) as refused:
            await requests.scheduler.acquire("a")
        waited = asyncio.get_running_loop().time() - started
        assert 0.05 <= waited < 1 and refused.value.problem.status == 429
        assert "no slot came free within 0.05 s" in refused.value.problem.detail
        assert requests.scheduler.waiting("a") == 0 and requests.scheduler.running("a") == 1

    run(test)


def test_another_tenants_request_is_served_before_the_first_tenants_backlog() -> None:
    async def test() -> None:
        # both slots of the process taken by tenant a, 3 more of a queued, then one of b
        requests = Requests(Limits(total=2, per_tenant=2, queue_depth=3, wait_s=5))
        scheduler = requests.scheduler
        await requests.send("a", "a1", "a2", "a3", "a4", "a5")
        await requests.send("b", "b1")
        assert requests.served == ["a1", "a2"]
        scheduler.release("a")
        await settle()
        scheduler.release("a")
        await settle()
        scheduler.release("b")
        await settle()
        # first come first served would be a3, a4, a5 and only then b1
        assert requests.served == ["a1", "a2", "b1", "a3", "a4"]

    run(test)


def test_freed_slots_go_round_the_waiting_tenants() -> None:
    async def test() -> None:
        requests = Requests(Limits(total=1, per_tenant=4, queue_depth=4, wait_s=5))
        await requests.send("x", "x1")
        await requests.send("a", "a1", "a2")
        await requests.send("b", "b1")
        await requests.send("c", "c1")
        for tenant in ("x", "a", "b", "c"):
            requests.scheduler.release(tenant)
            await settle()
        assert requests.served == ["x1", "a1", "b1", "c1", "a2"]  # FIFO: a2 before b1

    run(test)


def test_a_request_cancelled_while_waiting_leaves_the_queue() -> None:
    async def test() -> None:
        requests = Requests(Limits(total=1, per_tenant=1, queue_depth=2, wait_s=5))
        await requests.send("a", "a1")
        gone, kept = await requests.send("a", "a2", "a3")
        gone.cancel()
        await settle()
        assert requests.scheduler.waiting("a") == 1
        requests.scheduler.release("a")
        await settle()
        assert requests.served == ["a1", "a3"] and kept.done()

    run(test)
