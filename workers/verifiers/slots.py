"""A host-wide cap on live sandboxes: each holds an exclusive lock on one of N slot files.

Per-job and per-/test caps bound what one request opens, but every job process, every worker
and the API's /test calls on a host spawn sandboxes independently. flock locks belong to the
kernel, so every process of the host that uses the same directory counts against the same N,
and a process that dies, however it dies, releases its slots with it: nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path

from .sandbox import SandboxUnavailableError

HOST_CAP_ENV = "GRPO_MAX_SANDBOXES_PER_HOST"
DEFAULT_HOST_CAP = 64
SLOTS_DIR = Path(tempfile.gettempdir()) / "grpo-sandbox-slots"
WAIT_S = 5.0  # a full host usually frees a slot soon (a /test call ends, a batch recycles)
log = logging.getLogger(__name__)


class Slot:
    """One held slot; release() (or the death of this process) frees it."""

    def __init__(self, fd: int, index: int):
        self.fd: int | None = fd
        self.index = index

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the lock


def host_cap() -> int:
    """GRPO_MAX_SANDBOXES_PER_HOST, read when a sandbox starts (the workers import no settings)."""
    raw = os.environ.get(HOST_CAP_ENV, "").strip()
    if not raw:
        return DEFAULT_HOST_CAP
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        default = DEFAULT_HOST_CAP
        log.warning("%s=%r is not a positive integer; using %d", HOST_CAP_ENV, raw, default)
        return default
    return value


def acquire(cap: int | None = None, wait_s: float | None = None) -> Slot:
    """A free slot of `cap` (default: the host cap), waiting up to `wait_s` for one.

    Raises SandboxUnavailableError when none frees up: a job fails with
    `sandbox_unavailable`, a /test call answers 503, each with this message.
    """
    cap = host_cap() if cap is None else cap
    wait_s = WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        slot = _try_all(cap)
        if slot is not None:
            return slot
        if time.monotonic() >= deadline:
            raise SandboxUnavailableError(
                f"{cap} python verifier sandboxes already run on this host, its limit "
                f"({HOST_CAP_ENV}={cap}); try again when fewer run"
            )
        time.sleep(0.05)


def _try_all(cap: int) -> Slot | None:
    try:
        with contextlib.suppress(FileExistsError):
            SLOTS_DIR.mkdir()
            SLOTS_DIR.chmod(0o1777)  # like /tmp: every user's workers share one count
        for index in range(cap):
            # Read-only is enough for flock, so slot files made by another user work too.
            flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(SLOTS_DIR / f"slot-{index}", flags, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return Slot(fd, index)
    except OSError as exc:
        raise SandboxUnavailableError(
            f"cannot count this host's sandboxes in {SLOTS_DIR}: {exc}"
        ) from exc
    return None
