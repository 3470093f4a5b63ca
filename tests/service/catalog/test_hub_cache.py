"""Hub ids in the catalog, offline: `models add ORG/NAME` resolves the id through the shared
Hugging Face cache (HF_HOME, laid out as huggingface_hub writes it), pins the commit, and a
worker finds that same snapshot; an id the cache lacks is refused without reaching any hub.
(No hub can be reached here: the cache stands in for what a first download leaves.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy.orm import Session

from service.catalog.service import find_model
from service.core.db import make_engine
from service.settings import Settings
from workers.grpo.tiny_model import make_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_hub_id_is_pinned_from_the_shared_cache_offline(tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    repo = hf_home / "hub" / "models--acme--tiny-chat"
    make_tiny_model(repo / "snapshots" / COMMIT, chat_template=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "GRPO_DATA_DIR": str(tmp_path / "data"),
        "GRPO_HF_OFFLINE": "true",
    }
    for key in ("GRPO_DATABASE_URL", "GRPO_BROKER_URL", "GRPO_STORAGE_URL"):
        env.pop(key, None)
    assert _cli(env, "migrate").returncode == 0

    added = _cli(env, "models", "add", "tiny-chat", "acme/tiny-chat")
    assert added.returncode == 0, added.stderr
    missing = _cli(env, "models", "add", "other", "acme/not-cached")
    assert missing.returncode == 2 and "cannot fetch 'acme/not-cached'" in missing.stderr

    settings = Settings(data_dir=tmp_path / "data", hf_offline=True)
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as session:
        row = find_model(session, "tiny-chat")
        assert row is not None and find_model(session, "other") is None
        assert (row.source, row.source_kind, row.revision) == ("acme/tiny-chat", "hub", COMMIT)
        assert row.has_chat_template and row.context_length == 1024
    engine.dispose()
    # A worker process (HF_HOME set, offline) loads exactly the pinned snapshot.
    worker = subprocess.run(
        [sys.executable, "-c", WORKER_LOOKUP], env=env, capture_output=True, text=True, timeout=60
    )
    assert worker.returncode == 0, worker.stderr
    assert Path(worker.stdout.strip()) == repo / "snapshots" / COMMIT


WORKER_LOOKUP = """
from sqlalchemy.orm import Session
from service.catalog.service import find_model
from service.core.db import make_engine
from service.training.weights import model_path
from service.settings import get_settings
settings = get_settings()
with Session(make_engine(settings.effective_database_url)) as session:
    print(model_path(find_model(session, "tiny-chat"), settings))
"""
