"""The cipher of tenant secrets: Fernet (AES-128-CBC + HMAC-SHA256) under the operator's key.

`GRPO_SECRETS_KEY` holds one or more Fernet keys, comma-separated: the first encrypts, every one
decrypts (MultiFernet), so a key is rotated by putting the new one first. In embedded mode with
no key set, one is generated once into `DATA_DIR/secrets.key` (mode 0600). Each plaintext binds
the tenant and the name, so a ciphertext copied onto another tenant's row does not decrypt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from service.settings import Settings

KEY_FILE = "secrets.key"


class SecretsUnavailable(RuntimeError):
    """No key to encrypt or decrypt with (GRPO_SECRETS_KEY unset outside embedded mode)."""


def _embedded_key(data_path: Path) -> bytes:
    path = data_path / KEY_FILE
    data_path.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: of two processes starting at once, one writes the key, the other reads it
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    key = Fernet.generate_key()
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def cipher(settings: Settings) -> MultiFernet:
    if settings.secrets_key is not None:
        keys = [k.strip().encode() for k in settings.secrets_key.get_secret_value().split(",")]
    elif settings.embedded:
        keys = [_embedded_key(settings.data_path)]
    else:
        raise SecretsUnavailable("secrets are not configured: set GRPO_SECRETS_KEY")
    try:
        return MultiFernet([Fernet(k) for k in keys if k])
    except ValueError as exc:
        raise SecretsUnavailable(f"GRPO_SECRETS_KEY is not a valid Fernet key: {exc}") from None


def encrypt(settings: Settings, tenant_id: str, name: str, value: str) -> bytes:
    plain = json.dumps({"tenant": tenant_id, "name": name, "value": value})
    return cipher(settings).encrypt(plain.encode())


def decrypt(settings: Settings, tenant_id: str, name: str, token: bytes) -> str:
    try:
        plain = json.loads(cipher(settings).decrypt(token))
    except InvalidToken:
        raise SecretsUnavailable(f"secret '{name}' does not decrypt under the key(s)") from None
    if plain.get("tenant") != tenant_id or plain.get("name") != name:
        raise SecretsUnavailable(f"secret '{name}' belongs to another row")
    return str(plain["value"])
