"""Migration 0017 drops the NOTIFY trigger of 0015 (no one listens since the status-poll cache
went): at head a job UPDATE notifies no one; down to 0016 the trigger and its function are back
and notify again; up once more they are gone."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import make_url

from service.core.migrate import downgrade, upgrade

CHANNEL = "grpo_job_changed"


def _notified_by_an_update(db_url: str) -> list[str]:
    """The payloads a listener gets for one UPDATE of a job row (made in the same session)."""
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        conn.execute("INSERT INTO tenants (id, name, created_at) VALUES ('ten_n', 'n', now())")
        conn.execute(
            "INSERT INTO datasets (id, tenant_id, name, num_records, sha256, object_key, "
            "created_at) VALUES ('ds_n', 'ten_n', 'd', 1, 'x', 'k', now())"
        )
        conn.execute(
            "INSERT INTO jobs (id, tenant_id, dataset_id, status, spec, step, total_steps, "
            "epoch, attempts, queue, created_at) VALUES ('job_n', 'ten_n', 'ds_n', "
            "'queued', '{}', 0, 1, 0, 0, 'gpu', now())"
        )
        conn.execute("UPDATE jobs SET step = 1 WHERE id = 'job_n'")
        payloads = [note.payload for note in conn.notifies(timeout=0.5)]
        conn.execute("DELETE FROM jobs WHERE id = 'job_n'")
        conn.execute("DELETE FROM datasets WHERE id = 'ds_n'")
        conn.execute("DELETE FROM tenants WHERE id = 'ten_n'")
    return payloads


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_no_notification_at_head_and_back_after_a_downgrade(db_url: str) -> None:
    assert _notified_by_an_update(db_url) == []
    downgrade(db_url, "0016")
    assert _notified_by_an_update(db_url)[:1] == ["job_n"]
    upgrade(db_url)
    assert _notified_by_an_update(db_url) == []
