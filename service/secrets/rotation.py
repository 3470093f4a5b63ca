"""Re-encrypt every stored secret (tenant secrets, webhook signing secrets) under the first key
of `GRPO_SECRETS_KEY`.

Rotating a key: put the new key first (`NEW,OLD`; both decrypt, the new one encrypts), run
`grpo-service secrets rotate`, then drop the old key. Each row is rewritten in its own
transaction, after the old ciphertext was checked to decrypt, so an interrupted rotation leaves
every row readable under `NEW,OLD` and a rerun finishes it. A row that decrypts under none of
the keys is reported and left as it is (it was unreadable before, and stays recoverable with
the key that sealed it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.fernet import InvalidToken
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import TenantSecret, Webhook
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings


@dataclass
class Rotation:
    rotated: int = 0
    unreadable: list[str] = field(default_factory=list)  # rows left as they were


def rotate_secrets(sessions: sessionmaker[Session], settings: Settings) -> Rotation:
    cipher = crypto.cipher(settings)
    outcome = Rotation()
    for model, column in ((TenantSecret, "ciphertext"), (Webhook, "secret_ciphertext")):
        with sessions.begin() as session:
            ids = session.scalars(select(model.id).order_by(model.id)).all()
        for row_id in ids:
            with sessions.begin() as session:
                row = session.get(model, row_id, with_for_update=True)
                if row is None:  # deleted meanwhile
                    continue
                try:
                    setattr(row, column, cipher.rotate(getattr(row, column)))
                except InvalidToken:
                    outcome.unreadable.append(_describe(row))
                    continue
                if isinstance(row, TenantSecret):
                    row.updated_at = utcnow()
                outcome.rotated += 1
    return outcome


def _describe(row: object) -> str:
    if isinstance(row, TenantSecret):
        return f"{row.tenant_id}/{row.name}"
    assert isinstance(row, Webhook)
    return f"{row.tenant_id}/webhook {row.id}"
