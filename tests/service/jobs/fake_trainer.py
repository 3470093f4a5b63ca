"""A stand-in training process for the watchdog's tests: `python fake_trainer.py MODE [SECONDS]`.

It speaks the progress protocol on GRPO_PROGRESS_FD as the real one does, then misbehaves as
MODE says. It never touches the database: what the watchdog does about it is the test."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time


def send(kind: str, **data: object) -> None:
    os.write(int(os.environ["GRPO_PROGRESS_FD"]), (json.dumps({"k": kind, **data}) + "\n").encode())


def hold_the_gil(seconds: float) -> None:
    """Python `re` backtracking in C, the GIL held throughout, for about `seconds`."""
    pattern = re.compile(r"\\frac\s*\{\s*([^{}]*?)\s*\}\s*\{")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pattern.sub("", "\\frac{" + " " * 900)


def main(mode: str, seconds: float) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # hands the job back: done
    send("step_begins", step=1)
    if mode == "hang-in-verifier":
        send("scoring", verifier="spin")
    elif mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "hold-gil":
        hold_the_gil(seconds)
        send("step", step=1)
        return 0
    elif mode == "steps":
        for step in range(1, int(seconds) + 1):
            time.sleep(0.5)
            send("step", step=step)
            send("step_begins", step=step + 1)
        return 0
    while True:  # hang-in-step, hang-in-verifier, ignore-cancel
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
