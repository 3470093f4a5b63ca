"""Tinker requests are leased as jobs are (issue 46 item 5): a real API process on PostgreSQL, a
real tinker worker and the reconciler's loop, driven by the official `tinker` SDK. A worker
killed (-9) while it runs a long request, or cut off past its lease, leaves no future waiting:
the request fails with an error naming the lease within about the lease's time, and is not run
again; a live worker's lease on a long request is renewed and the request completes. The run's
state died with the worker: its next request says so, and load_state from a checkpoint brings it
back exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker
from sqlalchemy import create_engine, text
from tinker import types

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_tinker_sdk import ADAM, BATCH, client_for, datum, loss_of, start_worker
from tests.e2e.tinker_services import tinker_service

LEASE_S, HEARTBEAT_S, RECONCILE_S = 2.0, 0.25, 0.5
WAIT_S = 120  # a future nobody finishes would hang the SDK: fail instead
# Past the lease, the reconciler's next pass fails the request and the SDK's next poll (the
# long-poll is 1 s) reads it: a few seconds more on a loaded machine.
ANSWERED_WITHIN_S = LEASE_S + RECONCILE_S + 10
RECONCILER = (
    "import logging, threading\n"
    "from service.settings import get_settings\n"
    "from service.training.reconciler import run_forever\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "run_forever(get_settings(), threading.Event())\n"
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    """procs: the API, the tinker worker, the reconciler's loop (`grpo-service worker` runs it
    beside its Celery worker; here alone)."""
    leases = {"GRPO_LEASE_SECONDS": str(LEASE_S), "GRPO_HEARTBEAT_SECONDS": str(HEARTBEAT_S),
              "GRPO_RECONCILE_SECONDS": str(RECONCILE_S)}  # fmt: skip
    with tinker_service(tmp_path_factory.mktemp("tinker-lease"), tiny_model_dir, leases) as api:
        reconciler = [sys.executable, "-c", RECONCILER]
        with (api.log_dir / "reconciler.log").open("wb") as log:
            api.procs.append(
                subprocess.Popen(reconciler, env=api.env, stdout=log, stderr=subprocess.STDOUT)
            )
        yield api


def requests_of(svc: RunningService, tenant: str) -> list[dict[str, Any]]:
    """The tenant's requests, oldest first, as the database holds them."""
    engine = create_engine(svc.env["GRPO_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT r.* FROM tinker_requests r "
                    "JOIN tenants t ON t.id = r.tenant_id WHERE t.name = :name ORDER BY r.seq"
                ),
                {"name": tenant},
            )
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def wait_until_running(svc: RunningService, tenant: str, before: int) -> None:
    """Until the tenant's next request after its first `before` is running (the SDK sends it
    from a thread of its own)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        later = requests_of(svc, tenant)[before:]
        if later and later[0]["status"] == "running":
            return
        assert not later or later[0]["status"] == "queued", later[0]
        time.sleep(0.05)
    raise AssertionError(f"no request of {tenant} ran: {svc.logs()}")


def long_batch() -> list[types.Datum]:
    """A forward_backward of several seconds on the tiny model on a CPU: several leases long."""
    tokens = [5 + (7 * i) % 80 for i in range(1000)]
    return [datum(tokens) for _ in range(8)]


def trained_and_saved(client: tinker.ServiceClient) -> tuple[Any, str, float]:
    """A run that has trained (a step) and saved its state: the run, the path, its loss."""
    trainer = client.create_lora_training_client(base_model=TINY, rank=2, seed=5).result()
    trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
    trainer.optim_step(ADAM).result(WAIT_S)
    saved = trainer.save_state("before").result(WAIT_S).path
    return trainer, saved, loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S))


def assert_lost_then_restored(trainer: Any, saved: str, loss: float) -> None:
    """The run's state is gone: its next request says so; load_state brings it back exactly."""
    with pytest.raises(tinker.RequestFailedError, match="state were lost.*load_state"):
        trainer.forward(BATCH, "cross_entropy").result(WAIT_S)
    with pytest.warns(FutureWarning):  # the SDK's deprecation: load_state is still served
        trainer.load_state_with_optimizer(saved).result(WAIT_S)
    assert loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S)) == pytest.approx(
        loss, abs=1e-6
    )
    trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
    trainer.optim_step(ADAM).result(WAIT_S)  # and it trains on
    assert loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S)) < loss


def lapsed(request: dict[str, Any]) -> bool:
    """Failed for its lease, with no result: run once (epoch 1), not again."""
    error = request["error"] or {}
    return (
        request["status"] == "failed"
        and request["result"] is None
        and request.get("epoch") == 1
        and "lease" in error.get("error", "")
        and error.get("category") == "server"
    )


def test_a_long_request_whose_lease_its_worker_renews_completes(svc: RunningService) -> None:
    client = client_for(svc, "lease-long")
    try:
        trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
        started = time.monotonic()
        out = trainer.forward_backward(long_batch(), "cross_entropy").result(WAIT_S)
        took = time.monotonic() - started
        assert loss_of(out) > 0
        assert took > 2 * LEASE_S, f"not long enough to show the renewal: {took:.1f} s"
        fb = [r for r in requests_of(svc, "lease-long") if r["kind"] == "forward_backward"]
        assert [(r["status"], r.get("epoch")) for r in fb] == [("done", 1)]
    finally:
        client.close("success").result()


def test_a_worker_cut_off_past_its_lease_writes_nothing_and_forgets_the_run(
    svc: RunningService,
) -> None:
    """SIGSTOP (a hung worker, or one cut off from the database): the reconciler fails its
    request; woken, the worker's outcome is fenced off and the run it changed is forgotten."""
    client = client_for(svc, "lease-hung")
    worker = svc.procs[1]
    try:
        trainer, saved, loss = trained_and_saved(client)
        before = len(requests_of(svc, "lease-hung"))
        future = trainer.forward_backward(long_batch(), "cross_entropy")
        wait_until_running(svc, "lease-hung", before)
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with pytest.raises(tinker.RequestFailedError, match="lease"):
                future.result(WAIT_S)
            assert time.monotonic() - stopped < ANSWERED_WITHIN_S
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert_lost_then_restored(trainer, saved, loss)
        fb = [r for r in requests_of(svc, "lease-hung") if r["kind"] == "forward_backward"]
        assert lapsed(fb[1]), fb[1]  # the woken worker wrote nothing over the failure
        assert worker.poll() is None, svc.logs()
    finally:
        client.close("success").result()


def test_a_killed_workers_request_fails_naming_the_lease_and_its_run_comes_back(
    svc: RunningService,
) -> None:
    """kill -9 mid-request: the future answers a clear error within about the lease's time
    (no worker is running then: the reconciler's pass fails it), the request is never run
    again, and on a new worker the run's next request says its state was lost until
    load_state brings it back."""
    client = client_for(svc, "lease-killed")
    try:
        trainer, saved, loss = trained_and_saved(client)
        before = len(requests_of(svc, "lease-killed"))
        future = trainer.forward_backward(long_batch(), "cross_entropy")
        wait_until_running(svc, "lease-killed", before)
        svc.procs[1].kill()
        svc.procs[1].wait()
        killed = time.monotonic()
        with pytest.raises(tinker.RequestFailedError, match="lease") as failure:
            future.result(WAIT_S)
        assert time.monotonic() - killed < ANSWERED_WITHIN_S
        assert "will not run again" in str(failure.value)
        svc.procs[1] = start_worker(svc)  # a replacement: recovery needs no name of the old one
        assert_lost_then_restored(trainer, saved, loss)
        fb = [r for r in requests_of(svc, "lease-killed") if r["kind"] == "forward_backward"]
        assert lapsed(fb[1]), fb[1]
    finally:
        client.close("success").result()
