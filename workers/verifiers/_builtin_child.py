"""The helper process built-in verifier kinds run in.

`python -m workers.verifiers._builtin_child PARENT_PID`, started by `builtin_host.py`.

The kinds are our code, but their input is the tenant's (completions, dataset fields, patterns,
schemas), and some of that work spins in C with the GIL held (Python's `re` backtracking in the
numeric kind's LaTeX clean-up, jsonschema's `anyOf` over a nested instance). No thread can
interrupt that, so it runs here, where the parent (`builtin_host.py`) can kill it at the batch's
deadline without losing anything of its own.

Protocol (every frame a 4-byte big-endian length, then JSON):
  parent -> child, on stdin:
    {"op": "open", "id": int, "kind": str, "config": {...}, "name": str}
    {"op": "score", "id": int, "b": batch_id, "items": [sample, ...]}
    {"op": "close", "id": int}
  child -> parent, on the stdout it was started with (fd 1 is pointed at stderr first, so
  nothing a library prints can pass for a frame):
    {"ready": true}
    {"b": batch_id, "r": [i, score | null, error | null]}   one per item, as it is scored
    {"b": batch_id, "done": true}
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
ADDRESS_SPACE = 4 << 30  # a bound on what a pathological input can make it allocate


def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the thread that started us exits, however it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the kernel was told
        os._exit(1)


def _limit_memory() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> Any:
    return json.loads(_read_exact(fd, int.from_bytes(_read_exact(fd, 4), "big")))


def _write_frame(fd: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def serve(inp: int, out: int) -> None:
    from .factory import in_process_verifier

    verifiers: dict[int, Any] = {}
    _write_frame(out, {"ready": True})
    while True:
        try:
            msg = _read_frame(inp)
        except EOFError:
            return  # the parent closed the pipe (or died)
        op = msg.get("op")
        if op == "open":
            try:
                verifiers[msg["id"]] = in_process_verifier(msg["kind"], msg["config"], msg["name"])
            except Exception as exc:  # reported with each item of its batches
                verifiers[msg["id"]] = f"{type(exc).__name__}: {exc}"[:500]
        elif op == "close":
            verifiers.pop(msg["id"], None)
        elif op == "score":
            verifier, b = verifiers.get(msg["id"], "verifier not open"), msg["b"]
            for i, sample in enumerate(msg["items"]):
                if isinstance(verifier, str):
                    result = [i, None, verifier]
                else:
                    scores, errors = verifier.score([sample])
                    result = [i, scores[0], errors[0]]
                _write_frame(out, {"b": b, "r": result})
            _write_frame(out, {"b": b, "done": True})


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    _limit_memory()
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(0, out)


if __name__ == "__main__":
    main()
