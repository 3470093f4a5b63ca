"""How a python-verifier child is launched: bubblewrap, or (only when the operator says so) a
bare subprocess.

bubblewrap layout, everything read-only except a private tmpfs /tmp:
  the interpreter's prefix (sys.base_prefix, shared libs) at its own path; /lib, /lib64 and
  /usr/lib for libc/libm/libpython's dependencies; `_bootstrap.py` and `_seccomp.py` at
  /opt/grpo-verifier; allow-listed packages (numpy, sympy, mpmath if installed) each bound at
  /opt/grpo-verifier/site/<name>; nothing else: no project, no venv site-packages (the prefix's
  own site-packages is hidden under an empty tmpfs), no /etc, no /home, no data dir; / and /dev
  are remounted read-only, so the sized /tmp is the only place a file can hold memory.
Namespaces: all of them. As root the user namespace is left out on purpose: bwrap would map the
sandbox uid onto host root, for which the kernel ignores RLIMIT_NPROC. Instead the trusted
bootstrap (no user code loaded yet) drops to uid/gid 65534 with setgroups/setgid/setuid, the
only capabilities it is given, after which it holds none. Run as a normal user, bwrap gets
`--unshare-all --uid 65534` and the kernel uid is that user's, so RLIMIT_NPROC binds as well.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import cgroup

SANDBOX_UID = 65534  # nobody
UNSAFE_ENV = "GRPO_ALLOW_UNSAFE_VERIFIERS"
ALLOWED_PACKAGES = ("numpy", "sympy", "mpmath")
INNER_DIR = "/opt/grpo-verifier"
INNER_SITE = f"{INNER_DIR}/site"
TMP_BYTES = 64 << 20
HERE = Path(__file__).resolve().parent
CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    # A verifier may not start threads (RLIMIT_NPROC, see above): keep BLAS single-threaded.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SandboxUnavailableError(RuntimeError):
    """python verifiers are refused: no working bubblewrap and no explicit unsafe opt-in."""


def python_runtime() -> tuple[str, str]:
    """(interpreter path, prefix) of the real interpreter behind this (possibly venv) one."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return exe, prefix


def _package_binds() -> list[tuple[str, str]]:
    """(host dir, sandbox dir) for each allow-listed package installed here, plus its
    vendored shared libraries (`numpy.libs`)."""
    binds: list[tuple[str, str]] = []
    for name in ALLOWED_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        src = Path(next(iter(spec.submodule_search_locations))).resolve()
        binds.append((str(src), f"{INNER_SITE}/{name}"))
        libs = src.with_name(f"{name}.libs")
        if libs.is_dir():
            binds.append((str(libs), f"{INNER_SITE}/{name}.libs"))
    return binds


def _parents(path: str) -> list[str]:
    """Ancestors of `path` below /, outermost first."""
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


@functools.lru_cache(maxsize=1)
def _static_args() -> tuple[str, ...]:
    """The part of the bwrap command line that never changes within this process."""
    exe, prefix = python_runtime()
    root = os.geteuid() == 0
    args = ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if root:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for key, value in CHILD_ENV.items():
        args += ["--setenv", key, value]
    binds = [(prefix, prefix)]
    if not exe.startswith(prefix + os.sep):
        binds.append((exe, exe))
    binds += [(p, p) for p in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(p)]
    binds += [(str(HERE / f), f"{INNER_DIR}/{f}") for f in ("_bootstrap.py", "_seccomp.py")]
    binds += _package_binds()
    made: set[str] = set()
    for src, dst in binds:
        for parent in _parents(dst):  # world-traversable, whatever the host's modes are
            if parent not in made and parent not in {"/lib", "/usr", "/usr/lib"}:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", src, dst]
    site = Path(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    if (site / "site-packages").is_dir():  # hide the base interpreter's own packages
        args += ["--tmpfs", str(site / "site-packages")]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    # bwrap builds / and /dev as tmpfs without a size limit, owned by the sandbox uid when it
    # runs in a user namespace: files written there (1 MiB each under RLIMIT_FSIZE, but any
    # number of them) would hold host memory up to half the RAM. Only /tmp, sized, stays
    # writable; device nodes still work on a read-only mount.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return tuple(args)


def bwrap_command(result_fd: int) -> list[str]:
    """argv that starts the bootstrap inside bubblewrap; `result_fd` is inherited."""
    exe, _ = python_runtime()
    boot = f"{INNER_DIR}/_bootstrap.py"
    return [*_bwrap_prefix(), exe, "-I", "-S", "-B", boot, str(result_fd), INNER_SITE]


def _bwrap_prefix() -> list[str]:
    return [shutil.which("bwrap") or "bwrap", *_static_args()]


def unsafe_command(result_fd: int) -> list[str]:
    """argv for the explicitly allowed unsandboxed mode: an isolated interpreter only."""
    exe, _ = python_runtime()
    return [exe, "-I", "-S", "-B", str(HERE / "_bootstrap.py"), str(result_fd), ""]


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True when bubblewrap is installed and can build this sandbox here (probed once)."""
    if shutil.which("bwrap") is None:
        return False
    exe, _ = python_runtime()
    argv = [*_bwrap_prefix(), exe, "-I", "-S", "-c", "import os; os.stat('/tmp')"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def unsafe_allowed() -> bool:
    return os.environ.get(UNSAFE_ENV, "").strip().lower() in {"1", "true", "yes"}


def sandbox_mode() -> str:
    """'bubblewrap' | 'unsafe-subprocess' | 'unavailable': how python verifiers would run now.

    For the API's /readyz and the worker's start-up log, which is also where the memory-cgroup
    probe first runs and says what sandboxes get on this host (once per process).
    """
    if bwrap_works():
        mode = "bubblewrap"
    else:
        mode = "unsafe-subprocess" if unsafe_allowed() else "unavailable"
    if mode != "unavailable":
        cgroup.support()
    return mode


def sandbox_memory() -> str:
    """What holds a sandbox's memory on this host: its cgroup, or the rlimits only and why."""
    return cgroup.support().describe()


def require_sandbox() -> str:
    """The mode to launch with; raises SandboxUnavailableError when python verifiers are off."""
    mode = sandbox_mode()
    if mode == "unavailable":
        raise SandboxUnavailableError(
            "python verifiers need bubblewrap (`apt-get install bubblewrap`), which is missing or "
            f"cannot create namespaces on this host; set {UNSAFE_ENV}=1 to run them in an "
            "UNSANDBOXED subprocess instead (never on a shared host)"
        )
    return mode
