"""The one run supervisor (`service.training.supervisor`) for evaluations and pre-flights, on
both databases, with the job watchdog's stand-in run (`fake_trainer.py`): a run past its step
budget is killed with a clear status, as a job's is; a pre-flight whose supervisor is killed -9
is taken back by the reconciler instead of hanging; and a run is a fresh interpreter, not a
fork of the supervisor's process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.models import Evaluation, Preflight
from service.models.base import utcnow
from service.preflight import rows as preflight_rows
from service.settings import QueueSettings, Settings
from service.training import kinds, supervisor
from service.training.reconciler import reconcile_rows
from service.training.supervisor import Claim, RunKind
from tests.service.evaluations.test_rows import _new as new_evaluation
from tests.service.jobs.test_preflight_rows import make_preflight

FAKE = str(Path(__file__).with_name("fake_trainer.py"))


def settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path, "lease_seconds": 2.0, "heartbeat_seconds": 0.2,
        "queues": {"gpu": QueueSettings(step_timeout_s=1.5)}, "cancel_grace_s": 0.5,
        "max_attempts": 2, **overrides,
    }  # fmt: skip
    return Settings.model_validate(values)


def row(sessions: sessionmaker[Session], model: type, row_id: str) -> object:
    with sessions() as s:
        found = s.get(model, row_id)
        assert found is not None
        s.expunge(found)
        return found


@pytest.mark.usefixtures("scoped")
@pytest.mark.parametrize("kind", ["evaluation", "pre-flight"])
def test_a_run_past_its_step_budget_is_killed_with_a_clear_status(
    sessions: sessionmaker[Session], tmp_path: Path, kind: str
) -> None:
    run_kind, model = (
        (kinds.EVALUATION, Evaluation) if kind == "evaluation" else (kinds.PREFLIGHT, Preflight)
    )
    row_id = new_evaluation(sessions) if kind == "evaluation" else make_preflight(sessions)[0]
    start = time.monotonic()
    supervisor.supervise(
        run_kind, row_id, settings(tmp_path), [sys.executable, FAKE, "hang-in-step"]
    )
    assert 1.5 < time.monotonic() - start < 6
    found = row(sessions, model, row_id)
    assert found.status == "failed", found.error  # type: ignore[attr-defined]
    assert found.error == {  # type: ignore[attr-defined]
        "code": "step_timeout",
        "message": f"step 1 ran past its budget of 1.5s (queue 'gpu') without progress; the "
        f"{kind} process was killed",
    }


@pytest.mark.usefixtures("scoped")
def test_a_run_that_never_starts_its_first_step_is_killed_after_the_startup_budget(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    row_id = new_evaluation(sessions)
    cfg = settings(tmp_path, startup_timeout_s=1.0)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor.supervise(kinds.EVALUATION, row_id, cfg, sleep)
    found = row(sessions, Evaluation, row_id)
    assert found.status == "failed" and found.error["code"] == "step_timeout"  # type: ignore[attr-defined]
    assert "did not begin its first step within 1s" in found.error["message"]  # type: ignore[attr-defined]


@pytest.mark.usefixtures("scoped")
def test_a_cancelled_evaluation_deaf_to_it_is_killed_after_the_grace_and_cancelled(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    row_id = new_evaluation(sessions)
    cfg = settings(tmp_path, queues={"gpu": QueueSettings(step_timeout_s=60)})

    def cancel() -> None:
        time.sleep(1.0)
        with sessions.begin() as s:
            s.execute(update(Evaluation).where(Evaluation.id == row_id).values(status="cancelling"))

    threading.Thread(target=cancel).start()
    start = time.monotonic()
    supervisor.supervise(kinds.EVALUATION, row_id, cfg, [sys.executable, FAKE, "ignore-cancel"])
    assert 1.5 < time.monotonic() - start < 4
    assert row(sessions, Evaluation, row_id).status == "cancelled"  # type: ignore[attr-defined]


RUN = """
import os, signal, sys, time
from service.process_group import die_with_parent
die_with_parent(signal.SIGKILL)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""
SUPERVISE = """
import sys
from service.training import kinds, supervisor
run = [sys.executable, "-c", sys.argv[2], sys.argv[3]]
supervisor.supervise(kinds.PREFLIGHT, sys.argv[1], None, run)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_preflight_whose_supervisor_is_killed_is_reconciled(
    sessions: sessionmaker[Session], db_url: str, tmp_path: Path
) -> None:
    """kill -9 of the worker's supervisor: its run dies with it, the lease lapses, and the
    reconciler requeues the row; a row that used its last attempt so fails, saying why."""
    pf_id, _ = make_preflight(sessions)
    pid_file = tmp_path / "run.pid"
    env = {
        **os.environ, "GRPO_DATABASE_URL": db_url, "GRPO_DATA_DIR": str(tmp_path),
        "GRPO_LEASE_SECONDS": "1", "GRPO_HEARTBEAT_SECONDS": "0.2",
    }  # fmt: skip
    argv = [sys.executable, "-c", SUPERVISE, pf_id, RUN, str(pid_file)]
    sup = subprocess.Popen(argv, env=env)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and sup.poll() is None, "the run never started"
            time.sleep(0.1)
        assert row(sessions, Preflight, pf_id).status == "running"  # type: ignore[attr-defined]
        sup.send_signal(signal.SIGKILL)
    finally:
        sup.kill()
        sup.wait()
    run_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(run_pid):  # PR_SET_PDEATHSIG: it never outlives its supervisor
        assert time.monotonic() < deadline, "the run outlived its supervisor"
        time.sleep(0.05)
    time.sleep(1.2)  # the lease (1 s) lapses
    cfg = Settings(max_attempts=2, preflight_timeout_s=60)
    with sessions.begin() as s:
        requeued = reconcile_rows(s, cfg, lambda _queue: 1, preflight_rows)
        assert [r.id for r in requeued] == [pf_id]
    found = row(sessions, Preflight, pf_id)
    assert (found.status, found.attempts, found.error) == ("queued", 1, None)  # type: ignore[attr-defined]

    with sessions.begin() as s:  # the second and last claim's worker dies too
        assert preflight_rows.claim(s, pf_id, cfg) == 2
        past = utcnow() - timedelta(seconds=1)
        s.execute(update(Preflight).where(Preflight.id == pf_id).values(lease_until=past))
    with sessions.begin() as s:
        assert reconcile_rows(s, cfg, lambda _queue: 1, preflight_rows) == []
    found = row(sessions, Preflight, pf_id)
    assert found.status == "failed" and found.error["code"] == "lease_lost"  # type: ignore[attr-defined]
    assert "stopped renewing the lease, 2 times" in found.error["message"]  # type: ignore[attr-defined]


def test_a_run_is_a_fresh_interpreter(tmp_path: Path) -> None:
    """The kind's child runs as `python -m`, a process of its own (its parent the supervisor,
    a process group of its own), with none of the supervisor's modules loaded."""
    report = tmp_path / "report.json"
    probe = RunKind(
        name="probe",
        process="the probe",
        child="tests.service.jobs.fresh_probe",
        claim=lambda _id, _settings: Claim(1, "gpu", "tenant"),
        renew=lambda *_: "running",
        end=lambda *_: None,
        enqueue=lambda *_: None,
    )
    os.environ["GRPO_PROBE_REPORT"] = str(report)
    try:
        supervisor.supervise(probe, "row", settings(tmp_path))
    finally:
        del os.environ["GRPO_PROBE_REPORT"]
    seen = json.loads(report.read_text())
    assert seen["argv"] == ["row", "1", str(os.getpid())]
    assert seen["ppid"] == os.getpid() and seen["pgid"] == seen["pid"] != os.getpgid(0)
    assert seen["loaded"] == []  # none of the supervisor's (or pytest's) modules
    assert seen["progress_fd"]
