"""Pre-flight rows on both databases: one claim under a lease, outcomes only while that claim
holds the row, and a row whose worker overran ends `failed` with a reason instead of hanging
(a worker that died: `test_run_supervisor.py`)."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import get_or_create_tenant
from service.core.ids import new_id
from service.models import Preflight
from service.models.base import utcnow
from service.preflight import rows as preflight_rows
from service.settings import Settings
from service.training import kinds, supervisor


def make_preflight(sessions: sessionmaker[Session]) -> tuple[str, str]:
    with sessions.begin() as s:
        tenant = get_or_create_tenant(s, f"t-{new_id('x')}")
        row = Preflight(
            id=new_id("pf"), tenant_id=tenant.id, queue="gpu", spec={}, base_model="tiny"
        )
        s.add(row)
    return row.id, tenant.id


def age(sessions: sessionmaker[Session], pf_id: str, seconds: float) -> None:
    past = utcnow() - timedelta(seconds=seconds)
    with sessions.begin() as s:
        values = {"created_at": past, "started_at": past}
        s.execute(update(Preflight).where(Preflight.id == pf_id).values(**values))


def status(sessions: sessionmaker[Session], pf_id: str) -> tuple[str, dict | None]:
    with sessions() as s:
        row = s.get(Preflight, pf_id)
        assert row is not None
        return row.status, row.error


SETTINGS = Settings(preflight_timeout_s=60)


def test_claimed_once_and_finished_once(sessions: sessionmaker[Session]) -> None:
    pf_id, tenant = make_preflight(sessions)
    with sessions.begin() as s:
        assert preflight_rows.count_open(s, tenant, SETTINGS) == 1
        assert preflight_rows.claim(s, pf_id, SETTINGS) == 1
    with sessions.begin() as s:
        assert preflight_rows.claim(s, pf_id, SETTINGS) is None
        assert preflight_rows.finish(s, pf_id, 1, {"reward_mean": 1.0}) == "succeeded"
    with sessions.begin() as s:
        crash = {"code": "crashed", "message": "x"}
        assert preflight_rows.finish(s, pf_id, 1, None, crash) is None
        assert preflight_rows.count_open(s, tenant, SETTINGS) == 0
    assert status(sessions, pf_id) == ("succeeded", None)


@pytest.mark.parametrize("claimed", [False, True])
def test_overdue_rows_fail_with_a_reason(sessions: sessionmaker[Session], claimed: bool) -> None:
    pf_id, tenant = make_preflight(sessions)
    if claimed:  # running: its worker died with it
        with sessions.begin() as s:
            assert preflight_rows.claim(s, pf_id, SETTINGS) is not None
    age(sessions, pf_id, 61)
    with sessions.begin() as s:
        assert preflight_rows.count_open(s, tenant, SETTINGS) == 0  # expired: not counted
        assert preflight_rows.claim(s, pf_id, SETTINGS) is None  # too late for a worker
        row = s.get(Preflight, pf_id)
        assert row is not None
        preflight_rows.expire_overdue(s, row, SETTINGS)
        assert row.status == "failed"
    state, error = status(sessions, pf_id)
    assert state == "failed" and error is not None and error["code"] == "preflight_timeout"
    assert ("did not finish" if claimed else "no worker of queue 'gpu'") in error["message"]
    with sessions.begin() as s:  # the late worker's outcome writes nothing
        assert preflight_rows.finish(s, pf_id, 1, {"reward_mean": 1.0}) is None


@pytest.mark.usefixtures("scoped")
def test_supervisor_kills_an_overrun_and_records_a_crash(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    cfg = Settings(data_dir=tmp_path, preflight_timeout_s=1)
    hung, _ = make_preflight(sessions)
    start = time.monotonic()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor.supervise(kinds.PREFLIGHT, hung, cfg, sleep)
    assert time.monotonic() - start < 10
    state, error = status(sessions, hung)
    assert state == "failed" and error == {
        "code": "preflight_timeout",
        "message": "the pre-flight process did not finish within 1s (GRPO_PREFLIGHT_TIMEOUT_S) "
        "and was killed",
    }
    crashed, _ = make_preflight(sessions)
    supervisor.supervise(
        kinds.PREFLIGHT, crashed, cfg, [sys.executable, "-c", "raise SystemExit(3)"]
    )
    state, error = status(sessions, crashed)
    assert state == "failed" and error == {
        "code": "crashed", "message": "the pre-flight process died (exit status 3)"
    }  # fmt: skip
