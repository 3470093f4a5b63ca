"""Opaque, type-prefixed ids that sort by creation time (newest-first lists page by id)."""

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() // 1000:014x}{secrets.token_hex(6)}"
