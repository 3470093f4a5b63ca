"""A short in-process cache of API key lookups: the hot path (status polling) then costs no
database round trip for auth. A revoked key stops working within `auth_cache_s` seconds."""

from __future__ import annotations

import threading
import time

from fastapi.concurrency import run_in_threadpool

from service.auth.service import authenticate, hash_key
from service.db import session_scope

MAX_ENTRIES = 10_000

_lock = threading.Lock()
_entries: dict[str, tuple[float, str | None]] = {}


def _lookup(secret: str) -> str | None:
    with session_scope() as session:  # its own short transaction: last_used_at commits here
        return authenticate(session, secret)


async def tenant_for_key(secret: str, ttl_s: float) -> str | None:
    """The key's tenant id (None: unknown or revoked), from the cache when fresh."""
    if ttl_s <= 0:
        return await run_in_threadpool(_lookup, secret)
    digest = hash_key(secret)
    now = time.monotonic()
    hit = _entries.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    tenant_id = await run_in_threadpool(_lookup, secret)
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[digest] = (now + ttl_s, tenant_id)
    return tenant_id
