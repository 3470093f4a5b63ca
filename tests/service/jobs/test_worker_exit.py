"""A stopped Celery worker ends its main process as an interpreter does (it loads no engine:
each run is a fresh interpreter of its own): its exit functions run, and its status is
Celery's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_a_stopped_worker_runs_its_exit_functions_and_exits_0(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env |= {"GRPO_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}  # embedded
    temp = tmp_path / "tmp"  # where multiprocessing makes the folder it removes at exit
    temp.mkdir()
    env["TMPDIR"] = str(temp)
    pidfile, log = tmp_path / "worker.pid", tmp_path / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "service.worker", "worker", "-Q", "gpu",
               "-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat",
               "--loglevel", "INFO", "--pidfile", str(pidfile)]  # fmt: skip
    with log.open("wb") as out:
        worker = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while b"ready." not in log.read_bytes():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert pidfile.read_text().strip() == str(worker.pid)
        assert list(temp.glob("pymp-*"))
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert not list(temp.glob("pymp-*")), log.read_text()  # removed by an exit function
    assert not pidfile.exists(), log.read_text()
    assert b"Warm shutdown" in log.read_bytes()
