"""`grpo-service secrets rotate`, the real command on a real database: after a rotation onto a
new key, every secret (tenant secrets, webhook signing secrets) reads under the new key alone;
a row sealed under a key the operator no longer has is reported and left as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.models import Tenant, Webhook
from service.secrets import crypto
from service.secrets.service import put_secret, reveal
from service.settings import Settings
from service.webhooks.service import secret_name
from tests.redis_db import ROTATION, PrivateRedis

OLD, NEW, LOST = (Fernet.generate_key().decode() for _ in range(3))


def _settings(keys: str) -> Settings:
    return Settings(secrets_key=SecretStr(keys))


def _rotate(db_url: str, keys: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRPO_DATABASE_URL": db_url, "GRPO_SECRETS_KEY": keys}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "secrets", "rotate"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_rotate_moves_every_secret_onto_the_first_key(
    db_url: str, sessions: sessionmaker[Session]
) -> None:
    tenant = f"rot-{os.urandom(3).hex()}"
    with sessions.begin() as s:
        s.add(Tenant(id=tenant, name=tenant))
        s.flush()
        put_secret(s, _settings(OLD), tenant, "wandb-key", "w" * 40)
        put_secret(s, _settings(OLD), tenant, "hf-token", "hf_" + "x" * 30)
        put_secret(s, _settings(LOST), tenant, "sealed-elsewhere", "gone")
        sealed = crypto.encrypt(_settings(OLD), tenant, secret_name(f"wh_{tenant}"), "whsec_abc")
        s.add(Webhook(id=f"wh_{tenant}", tenant_id=tenant, url="https://example.com/h",
                      events=["job.succeeded"], secret_ciphertext=sealed))  # fmt: skip

    done = _rotate(db_url, f"{NEW},{OLD}")
    assert done.returncode == 1, done.stderr  # one row it could not read
    assert "re-encrypted under the first key" in done.stderr
    assert f"{tenant}/sealed-elsewhere" in done.stderr.replace("\n", "")

    with sessions.begin() as s:
        assert reveal(s, _settings(NEW), tenant, "wandb-key") == "w" * 40
        assert reveal(s, _settings(NEW), tenant, "hf-token") == "hf_" + "x" * 30
        with pytest.raises(crypto.SecretsUnavailable):
            reveal(s, _settings(OLD), tenant, "wandb-key")  # the old key reads nothing now
        assert reveal(s, _settings(LOST), tenant, "sealed-elsewhere") == "gone"  # untouched
        hook = s.get(Webhook, f"wh_{tenant}")
        assert hook is not None
        plain = crypto.decrypt(
            _settings(NEW), tenant, secret_name(f"wh_{tenant}"), hook.secret_ciphertext
        )
        assert plain == "whsec_abc"


def test_rotate_without_a_key_says_so(db_url: str, redis_server: PrivateRedis) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SECRETS_KEY"}
    env.update(GRPO_DATABASE_URL=db_url, GRPO_BROKER_URL=redis_server.url(ROTATION))
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "secrets", "rotate"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "GRPO_SECRETS_KEY" in done.stderr
