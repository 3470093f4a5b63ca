"""A short in-process cache of API key lookups: the hot path (status polling) then costs no
database round trip for auth. A revoked key stops working within `auth_cache_s` seconds.

Only keys that authenticated are cached, least recently used evicted first past
`auth_cache_entries`: a flood of invalid keys adds nothing, so it can neither evict the valid
entries (each one a database lookup again) nor grow the cache. Invalid keys are paid for by
the failed-auth throttle instead (`service/auth/throttle.py`). Touched on the event loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from fastapi.concurrency import run_in_threadpool

from service.auth.service import KeyIdentity, authenticate, hash_key
from service.core.db import session_scope
from service.settings import get_settings

# (database, digest) -> (expires at, identity), least recently used first. The database is part
# of the entry's name because a process may host apps of different databases
# (`service.settings.settings_in_force`): a key is one database's.
_entries: OrderedDict[tuple[str, str], tuple[float, KeyIdentity]] = OrderedDict()


def _entry(secret: str) -> tuple[str, str]:
    return get_settings().effective_database_url, hash_key(secret)


def _lookup(secret: str) -> KeyIdentity | None:
    with session_scope() as session:  # its own short transaction: last_used_at commits here
        return authenticate(session, secret)


def cached_key(secret: str, ttl_s: float) -> KeyIdentity | None:
    """The key's identity if a fresh lookup of it is cached, else None (look it up)."""
    if ttl_s <= 0:
        return None
    entry = _entry(secret)
    hit = _entries.get(entry)
    if hit is None:
        return None
    if hit[0] <= time.monotonic():
        del _entries[entry]
        return None
    _entries.move_to_end(entry)
    return hit[1]


async def lookup(secret: str, ttl_s: float, max_entries: int) -> KeyIdentity | None:
    """Look the key up in the database (None: unknown or revoked); cache it if valid."""
    identity = await run_in_threadpool(_lookup, secret)
    if identity is not None and ttl_s > 0:
        entry = _entry(secret)
        _entries[entry] = (time.monotonic() + ttl_s, identity)
        _entries.move_to_end(entry)
        while len(_entries) > max_entries:
            _entries.popitem(last=False)
    return identity


async def key_for_secret(secret: str, ttl_s: float, max_entries: int) -> KeyIdentity | None:
    """The key's identity (None: unknown or revoked), from the cache when fresh."""
    return cached_key(secret, ttl_s) or await lookup(secret, ttl_s, max_entries)
