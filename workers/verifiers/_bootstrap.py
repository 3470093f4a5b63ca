"""Trusted bootstrap of the python-verifier child process.

Run by file path in an isolated interpreter (`python -I -S -B _bootstrap.py RESULT_FD`); it
imports only the standard library, so the child needs neither the project nor site-packages.

Run as `_bootstrap.py RESULT_FD SITE_DIR` (SITE_DIR: allow-listed packages, may be empty).

Protocol (every frame is a 4-byte big-endian length followed by UTF-8 JSON):
  parent -> child, on stdin:
    1. init  {"nonce", "source", "entry": "verify"|"grade"|..., "limits": {...},
              "uid": int|null (drop to it when started as root), "seccomp": bool,
              "runtime": str (optional)}
    2. batch {"b": batch_id, "timeout_s": float, "items": [sample, ...]}  (repeated)
  child -> parent, on RESULT_FD only (stdout/stderr go to /dev/null):
    {"n": nonce, "ready": true} | {"n": nonce, "load_error": str}
    {"n": nonce, "b": batch_id, "r": [result, ...]}   results (one per frame today), where
        result = [i, "v", float] | [i, "t", type, repr] (not a number) | [i, "e", "Type: msg"]
                 | [i, "j", JSON value] (with a runtime)
    {"n": nonce, "b": batch_id, "done": true, "cpu": seconds, "recycle": bool}

Order of start-up, all before any user code is compiled: drop privileges (setgroups, setgid,
setuid: no capabilities are left), rlimits, seccomp filter.

A `runtime` is the source of a standard-library-only module of ours (multi-turn environments:
workers/environments/_runtime.py) that gives the child a protocol of its own: after the user's
source has run, its `make_caller(module)` returns the per-item function, whose JSON-able return
value goes back as a "j" result. It runs in the same sandbox as the user's code and is trusted
no more than it: the parent checks every result.
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


def _drop_privileges(uid):
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("setuid did not take effect")


def _start_up(init, write):
    """Privileges, rlimits, seccomp; False (and a load_error frame) when any step fails."""
    steps = [
        ("drop privileges", lambda: _drop_privileges(init.get("uid"))),
        ("set resource limits", lambda: _set_limits(init.get("limits") or {})),
    ]
    if init.get("seccomp"):
        steps.append(("install the seccomp filter", _install_seccomp))
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            write({"n": init["nonce"], "load_error": f"could not {what}: " + _error_text(exc)})
            return False
    return True


def _install_seccomp():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import _seccomp
    finally:
        sys.path.remove(here)
    _seccomp.install()
    sys.modules.pop("_seccomp", None)


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
        return ["t", type(value).__name__, _safe_repr(value)]
    try:
        return ["v", float(value)]
    except Exception as exc:
        return ["e", _error_text(exc)]


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


def _runtime_caller(runtime, module):
    namespace = {"__name__": "_runtime"}
    exec(compile(runtime, "<runtime>", "exec", dont_inherit=True), namespace)
    return namespace["make_caller"](module)


def _write_json_result(write, nonce, b, i, value):
    try:
        write({"n": nonce, "b": b, "r": [[i, "j", value]]})
    except (TypeError, ValueError, RecursionError) as exc:  # nothing was written yet
        write({"n": nonce, "b": b, "r": [[i, "e", "result is not JSON: " + _error_text(exc)]]})


def _run_batch(batch, call, write, nonce, cpu_hard, as_json=False):
    b = batch["b"]
    timeout_s = float(batch.get("timeout_s") or 10.0)
    if cpu_hard is not None:
        with contextlib.suppress(ValueError, OSError):
            _arm_cpu(timeout_s, cpu_hard)
    # One frame per item, written as soon as it is known: a later item that hangs or kills
    # the process cannot take the earlier results with it (at some cost in peak throughput).
    for i, sample in enumerate(batch["items"]):
        try:
            value = call(sample)
            if as_json:
                _write_json_result(write, nonce, b, i, value)
                continue
            if type(value) is float or (type(value) is int and -(2**53) <= value <= 2**53):
                item = [i, "v", value]
            else:
                item = [i, *_classify(value)]
        except BaseException as exc:  # SystemExit too; KeyboardInterrupt
            item = [i, "e", _error_text(exc)]
        write({"n": nonce, "b": b, "r": [item]})
    used = _cpu_used()
    recycle = cpu_hard is not None and used + 2 * timeout_s + 2 > cpu_hard
    write({"n": nonce, "b": b, "done": True, "cpu": used, "recycle": recycle})


def main():
    result_fd = int(sys.argv[1])
    site = sys.argv[2] if len(sys.argv) > 2 else ""
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
    cpu_hard = (init.get("limits") or {}).get("cpu_s")
    if not _start_up(init, write):
        return
    if site:
        sys.path.append(site)

    entry = init.get("entry") or "verify"
    runtime = init.get("runtime")
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
        call = _make_caller(fn, entry) if runtime is None else _runtime_caller(runtime, module)
    except BaseException as exc:  # includes SystemExit from user code
        write({"n": nonce, "load_error": _error_text(exc)})
        return
    write({"n": nonce, "ready": True})

    while True:
        try:
            batch = _read_frame(0)
        except EOFError:
            return
        _run_batch(batch, call, write, nonce, cpu_hard, runtime is not None)


if __name__ == "__main__":
    main()
