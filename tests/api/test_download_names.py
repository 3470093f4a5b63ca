"""A download keeps any name (issue 46 item 9): a Tinker checkpoint's name is the tenant's, and
its archive's Content-Disposition (RFC 6266) carries it exactly in `filename*` and as an ASCII
stand-in in `filename`, whatever it holds: letters outside Latin-1 (a 500 before), CR and LF
(a header split in two), quotes (a name cut short). Over real HTTP: uvicorn writes the header."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy.orm import Session
from werkzeug.http import parse_options_header

from service.core.db import make_engine
from service.models import TinkerCheckpoint
from service.storage import open_storage_from_settings
from tests.api.conftest import served_over_http
from tests.api.server import settings_of
from tests.e2e.services import TINY, RunningService

api = served_over_http()

NAMES = {
    "non-latin-1": "模型 v2",
    "cr-lf": "a\r\nSet-Cookie: x=1",
    "quotes": 'say "hi"; filename="evil.sh"',
    "latin-1": "café",
    "percent-and-slashes": "100%\\x",
}


def seed_tinker_checkpoint(svc: RunningService, key: str, name: str, data: bytes) -> str:
    """A run whose save_weights under `name` the API accepted, and the checkpoint a tinker
    worker then leaves (tests/api has no worker); its archive's URL."""
    with httpx.Client(base_url=svc.base_url, headers={"X-API-Key": f"tml-{key}"}) as c:
        session_id = c.post("/api/v1/create_session", json={}).json()["session_id"]
        body = {"session_id": session_id, "base_model": TINY, "lora_config": {"rank": 2}}
        run_id = c.post("/api/v1/create_model", json=body).json()["model_id"]
        r = c.post("/api/v1/save_weights", json={"model_id": run_id, "path": name})
        assert r.status_code == 200, r.text
        tenant_id = c.get("/api/v1/training_runs").json()["training_runs"][0]["model_owner"]
    settings = settings_of(svc)
    object_key = f"tinker/{tenant_id}/tkc_{secrets.token_hex(8)}.tar"
    open_storage_from_settings(settings).put_bytes(object_key, data)
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        s.add(TinkerCheckpoint(id=f"tkc_{secrets.token_hex(8)}", run_id=run_id,
                               tenant_id=tenant_id, kind="training", name=name,
                               object_key=object_key, size_bytes=len(data)))  # fmt: skip
    engine.dispose()
    return f"/api/v1/training_runs/{run_id}/checkpoints/weights/{quote(name, safe='')}/archive"


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_a_tinker_archive_downloads_under_its_exact_name(api: RunningService, name: str) -> None:
    key = api.new_key(f"names-{secrets.token_hex(4)}")
    data = secrets.token_bytes(1000)
    url = seed_tinker_checkpoint(api, key, name, data)
    r = httpx.get(api.base_url + url, headers={"X-API-Key": f"tml-{key}"})
    assert r.status_code == 200, r.text
    assert r.content == data
    value = r.headers["content-disposition"]
    # as a client that reads RFC 6266 does (Werkzeug's parser): filename*, decoded
    assert parse_options_header(value) == ("attachment", {"filename": f"{name}.tar"})
    fallback = re.fullmatch(r'attachment; filename="([^"\\]*)"; filename\*=.*', value)
    assert fallback is not None, value
    assert re.fullmatch(r"[\x20-\x7e]+\.tar", fallback.group(1)), fallback.group(1)
    assert "Set-Cookie" not in r.headers  # no header of the name's making


def test_every_content_disposition_is_built_by_the_one_helper() -> None:
    root = Path(__file__).resolve().parents[2] / "service"
    raw = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in root.rglob("*.py")
        if path.name not in ("content_disposition.py", "models_generated.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "Content-Disposition" in line and "attachment(" not in line
    ]
    assert raw == []
