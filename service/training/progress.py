"""Progress beacons: how a run (a job's training process, an evaluation, a pre-flight) tells its
supervisor that it is getting somewhere.

The run writes one short JSON line per event to a pipe its supervisor reads (`supervisor.py`,
in the Celery pool process, which runs no tenant code):
  {"k": "step_begins", "step": n}   at every step boundary (the engine's should_stop hook)
  {"k": "step", "step": n}           step n recorded
  {"k": "checkpoint", "step": n}     step n's checkpoint stored
  {"k": "scoring", "verifier": name} a verifier's batch starts ... {"k": "scored"} it ended
A line is far below PIPE_BUF, so each write is atomic; writes never block the trainer (a full
pipe drops the line: the watchdog reads continuously, so that would mean it is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

FD_ENV = "GRPO_PROGRESS_FD"
PROGRESS = ("step_begins", "step", "checkpoint")  # the kinds that restart the step clock


class Beacon:
    """The training process's end. Without a pipe (a job run in-process) it sends nothing."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        if fd is not None:
            os.set_blocking(fd, False)

    @classmethod
    def from_env(cls) -> Beacon:
        raw = os.environ.pop(FD_ENV, "")  # not passed on to the trainer's own children
        return cls(int(raw) if raw.isdigit() else None)

    def send(self, kind: str, **data: Any) -> None:
        if self.fd is None:
            return
        line = json.dumps({"k": kind, **data}, separators=(",", ":"))[:500] + "\n"
        # A full pipe or a gone watchdog drops the line (the kernel's death signal follows).
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.fd, line.encode())


@dataclass
class Progress:
    """The watchdog's end: what the training process last said, and when."""

    since: float = field(default_factory=time.monotonic)  # the step clock's start
    started: bool = False  # a first step has begun: start-up is over
    step: int | None = None  # the step under way (or last begun)
    verifier: str | None = None  # the verifier whose batch is being scored
    verifier_since: float = 0.0
    _buf: bytes = b""

    def feed(self, data: bytes, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            self._apply(msg, now)

    def _apply(self, msg: dict[str, Any], now: float) -> None:
        kind = msg.get("k")
        if kind in PROGRESS:
            self.since = now
            if kind == "step_begins":
                self.started = True
                self.step = msg.get("step")
        elif kind == "scoring":
            self.verifier, self.verifier_since = str(msg.get("verifier")), now
        elif kind == "scored":
            self.verifier = None
