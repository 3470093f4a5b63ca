"""Trusted bootstrap of the python-verifier child process.

Run by file path in an isolated interpreter (`python -I -S -B _bootstrap.py RESULT_FD`); it
imports only the standard library, so the child needs neither the project nor site-packages.

Protocol (every frame is a 4-byte big-endian length followed by UTF-8 JSON):
  parent -> child, on stdin:
    1. init  {"nonce", "source", "entry": "verify"|"grade", "limits": {...}}
    2. batch {"b": batch_id, "timeout_s": float, "items": [sample, ...]}  (repeated)
  child -> parent, on RESULT_FD only (stdout/stderr go to /dev/null):
    {"n": nonce, "ready": true} | {"n": nonce, "load_error": str}
    {"n": nonce, "b": batch_id, "i": index, "v": float}            one result
    {"n": nonce, "b": batch_id, "i": index, "t": type, "r": repr}  not a number
    {"n": nonce, "b": batch_id, "i": index, "e": "Type: message"}  exception
    {"n": nonce, "b": batch_id, "done": true, "cpu": seconds, "recycle": bool}

rlimits are applied before the user source is compiled or run.
"""

import contextlib
import json
import math
import numbers
import os
import resource
import sys
import types

MAX_FRAME = 512 * 1024 * 1024
MAX_ERROR = 500


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd):
    n = int.from_bytes(_read_exact(fd, 4), "big")
    if n > MAX_FRAME:
        raise EOFError
    return json.loads(_read_exact(fd, n))


def _writer(fd):
    def write(obj):
        data = json.dumps(obj).encode()
        data = len(data).to_bytes(4, "big") + data
        while data:
            data = data[os.write(fd, data) :]

    return write


def _cpu_used():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _set_limits(limits):
    plan = [
        ("RLIMIT_CORE", 0),
        ("RLIMIT_AS", limits.get("memory_bytes")),
        ("RLIMIT_FSIZE", limits.get("file_bytes")),
        ("RLIMIT_NOFILE", limits.get("open_files")),
        ("RLIMIT_NPROC", limits.get("processes")),
    ]
    for name, value in plan:
        if value is None or not hasattr(resource, name):
            continue
        res = getattr(resource, name)
        _soft, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))
    cpu = limits.get("cpu_s")
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))


def _arm_cpu(timeout_s, hard):
    """Soft CPU limit for one batch (SIGXCPU kills the child); the hard limit is for life."""
    soft = int(math.ceil(_cpu_used() + timeout_s)) + 1
    if hard is not None:
        soft = min(soft, int(hard))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, int(hard) if hard is not None else soft))


def _error_text(exc):
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__
        text = type(exc).__name__
    return text[:MAX_ERROR]


def _safe_repr(v):
    try:
        return repr(v)[:100]
    except Exception:
        return "?"


def _classify(value):
    # Real numbers (int, float, Fraction, numpy scalars) and Decimal; not bool, not complex.
    real = isinstance(value, numbers.Real) or (
        isinstance(value, numbers.Number) and not isinstance(value, numbers.Complex)
    )
    if isinstance(value, bool) or not real:
        return {"t": type(value).__name__, "r": _safe_repr(value)}
    try:
        return {"v": float(value)}
    except Exception as exc:
        return {"e": _error_text(exc)}


def _make_caller(fn, entry):
    if entry == "grade":

        def call(sample):
            completion = sample.get("completion")
            try:
                parsed = json.loads(completion) if isinstance(completion, str) else None
            except ValueError:
                parsed = None
            graded = {
                "output_text": completion,
                "output_json": parsed,
                "output_tools": [],
                "choices": [],
            }
            item = {k: v for k, v in sample.items() if k != "completion"}
            return fn(graded, item)

        return call

    import inspect

    accepts = None  # None: pass every field
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params):
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        accepts = {p.name for p in params if p.kind in kinds}

    def call(sample):
        fields = {k: v for k, v in sample.items() if k not in ("prompt", "completion")}
        if accepts is not None:
            fields = {k: v for k, v in fields.items() if k in accepts}
        return fn(sample.get("prompt"), sample.get("completion"), **fields)

    return call


def main():
    result_fd = int(sys.argv[1])
    # User output must never reach the parent: fds 1 and 2 point at /dev/null, whatever the
    # launcher gave us, and the result pipe is the only channel back.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    sys.stderr = sys.stdout

    init = _read_frame(0)
    nonce = init["nonce"]
    write = _writer(result_fd)
    limits = init.get("limits") or {}
    cpu_hard = limits.get("cpu_s")

    try:
        _set_limits(limits)
    except Exception as exc:
        write({"n": nonce, "load_error": "could not set resource limits: " + _error_text(exc)})
        return

    entry = init.get("entry") or "verify"
    module = types.ModuleType("verifier")
    module.__file__ = "<verifier>"
    sys.modules["verifier"] = module
    try:
        code = compile(init["source"], "<verifier>", "exec", dont_inherit=True)
        del init
        exec(code, module.__dict__)
        fn = module.__dict__.get(entry)
        if not callable(fn):
            raise TypeError(f"`{entry}` is not callable")
        call = _make_caller(fn, entry)
    except BaseException as exc:  # includes SystemExit from user code
        write({"n": nonce, "load_error": _error_text(exc)})
        return
    write({"n": nonce, "ready": True})

    while True:
        try:
            batch = _read_frame(0)
        except EOFError:
            return
        b = batch["b"]
        timeout_s = float(batch.get("timeout_s") or 10.0)
        if cpu_hard is not None:
            with contextlib.suppress(ValueError, OSError):
                _arm_cpu(timeout_s, cpu_hard)
        for i, sample in enumerate(batch["items"]):
            try:
                out = _classify(call(sample))
            except BaseException as exc:  # SystemExit too; KeyboardInterrupt
                out = {"e": _error_text(exc)}
            out.update(n=nonce, b=b, i=i)
            write(out)
        used = _cpu_used()
        recycle = cpu_hard is not None and used + 2 * timeout_s + 2 > cpu_hard
        write({"n": nonce, "b": b, "done": True, "cpu": used, "recycle": recycle})


if __name__ == "__main__":
    main()
