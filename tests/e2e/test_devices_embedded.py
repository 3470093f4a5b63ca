"""A two-device worker on the embedded default (no broker URL: kombu's filesystem transport,
SQLite, local storage): `grpo-service worker --devices 2` starts, consumes its device classes
and trains a two-device job. The filesystem transport refuses queue names outside
`[A-Za-z0-9._-]`, which once killed this worker at start (`gpu@2`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.worker import device_classes
from tests.e2e.services import (
    QUEUES,
    TINY,
    RunningService,
    _spawn,
    _wait_ready,
    free_port,
    stop_all,
)
from tests.e2e.test_training_flow import submit_digit_job

FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def embedded_two_devices(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("embedded-devices")
    port = free_port()
    env = {**os.environ, "GRPO_DATA_DIR": str(work / "data"), "GRPO_QUEUES": QUEUES}
    for production in ("GRPO_BROKER_URL", "GRPO_DATABASE_URL", "GRPO_STORAGE_URL"):
        env.pop(production, None)
    svc = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    svc.migrate()
    svc.procs.append(_spawn(["api", "--port", str(port)], env, work / "api.log"))
    worker = ["worker", "--devices", "2", "--grace-seconds", "30"]
    svc.procs.append(_spawn(worker, env, work / "worker.log"))
    try:
        # Registered while the two processes start (SQLite in WAL mode, writers queue): the
        # catalog is read only when the test submits its job.
        svc.add_model(TINY, tiny_model_dir)
        _wait_ready(svc)
        yield svc
    finally:
        stop_all(svc.procs)


def test_device_classes_are_names_the_filesystem_transport_accepts() -> None:
    from kombu.transport.filesystem import EXCHANGE_NAME_RE

    classes = device_classes("gpu", 4)
    assert classes == ["gpu", "gpu.x2", "gpu.x3", "gpu.x4"]
    assert all(EXCHANGE_NAME_RE.match(name) for name in classes)


def test_a_declared_queue_cannot_take_a_device_class_name() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="reserved for the broker queues of N-device jobs"):
        Settings.model_validate({"queues": {"gpu": {}, "gpu.x2": {}}})


def test_an_embedded_two_device_worker_trains_a_two_device_job(
    embedded_two_devices: RunningService,
) -> None:
    svc = embedded_two_devices
    with svc.client(svc.new_key("embedded-devices")) as client:
        job = submit_digit_job(
            client,
            TINY,
            grpo={"steps": 2, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
            checkpoint_every=2,
            resources={"devices": 2},
        )
        deadline = time.monotonic() + 300
        while (final := client.get(f"/v1/jobs/{job['id']}").json())["status"] not in FINAL:
            # a worker that cannot declare its queues dies at start: say so, do not wait it out
            assert all(p.poll() is None for p in svc.procs), svc.logs()
            assert time.monotonic() < deadline, (final, svc.logs())
            time.sleep(0.2)
    assert final["status"] == "succeeded", svc.logs()
    assert final["spec"]["resources"]["devices"] == 2
