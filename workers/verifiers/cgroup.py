"""A memory cgroup per sandbox: a limit on every page the sandbox holds, however it got it.

RLIMIT_AS caps one process's address space and nothing else: a tmpfs file, kernel buffers or
a shared-memory segment the seccomp filter missed are not in it. A memory cgroup is charged
for all of them. Each sandbox gets its own, made before it starts and removed once it is
reaped:

- cgroup v2: `memory.max` = the limit, `memory.swap.max` = 0, `memory.oom.group` = 1 (an OOM
  kill takes the whole sandbox). It needs a cgroup that delegates `memory` to its children
  (`memory` in its `cgroup.subtree_control`) and that this process may write:
  `GRPO_SANDBOX_CGROUP`, else the worker's own cgroup. v2 lets no cgroup that holds processes
  delegate a controller (the root excepted), so on most v2 hosts the operator names one, e.g.
  the unit's own cgroup under systemd's `Delegate=yes` with `DelegateSubgroup=`.
- cgroup v1, where the memory controller is mounted as v1 (older and hybrid hosts) and its
  hierarchy is writable (in practice: root): `memory.limit_in_bytes` and
  `memory.memsw.limit_in_bytes` (memory + swap, where swap is accounted) = the limit, under
  the worker's own memory cgroup or `GRPO_SANDBOX_CGROUP`.
- neither: no cgroup, only the rlimits hold a sandbox; said once per process in the log.

A sandbox is launched through `/bin/sh -c 'echo 0 > cgroup.procs && exec bwrap ...'`: the
shell moves itself into the cgroup before it becomes bwrap, so every process of the sandbox is
born inside it and none ever runs outside.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ENV = "GRPO_SANDBOX_CGROUP"
PREFIX = "grpo-sbx-"
SHELL = "/bin/sh"
# `$0` is the cgroup.procs file; writing 0 moves the writer, i.e. the shell itself.
ENTER = 'echo 0 > "$0" && exec "$@"'
PROBE_BYTES = 64 << 20
log = logging.getLogger(__name__)
_lock = threading.Lock()
_known: Support | None = None


def _limit_plan(version: str, memory_bytes: int) -> list[tuple[str, str, bool]]:
    """(file, value, required) in the order they must be written (v1: memsw >= limit)."""
    n = str(memory_bytes)
    if version == "v2":
        return [("memory.max", n, True), ("memory.swap.max", "0", False),
                ("memory.oom.group", "1", False)]  # fmt: skip
    return [("memory.limit_in_bytes", n, True), ("memory.memsw.limit_in_bytes", n, False)]


@dataclass(frozen=True)
class Support:
    """What this host gives a sandbox: a cgroup version and where its cgroups are made."""

    version: str | None  # "v2" | "v1" | None (no memory cgroup)
    parent: Path | None = None
    reason: str = ""  # why there is none

    def describe(self) -> str:
        """For the log and /readyz: what a sandbox gets, or why it gets no cgroup."""
        if self.version is None:
            return f"no memory cgroup, rlimits only ({self.reason})"
        files = ", ".join(name for name, _, _ in _limit_plan(self.version, 0))
        return f"a memory cgroup (v{self.version[1:]}) each, under {self.parent}: {files}"


@dataclass
class MemoryCgroup:
    """One sandbox's cgroup."""

    path: Path
    version: str
    memory_bytes: int

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started inside this cgroup."""
        return [SHELL, "-c", ENTER, str(self.procs), *argv]

    def limits(self) -> dict[str, str]:
        """The limit files as the kernel reads them back (for tests and reports)."""
        plan = _limit_plan(self.version, self.memory_bytes)
        files = (self.path / name for name, _, _ in plan)
        return {f.name: f.read_text().strip() for f in files if f.exists()}

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer has killed in this cgroup."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(found.group(1)) if found else 0

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Kill whatever is left inside, then rmdir (EBUSY until the last process is gone)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._kill_members()
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("could not remove the sandbox cgroup %s: %s", self.path, exc)
                    return False
            time.sleep(0.01)

    def _kill_members(self) -> None:
        kill_file = self.path / "cgroup.kill"  # v2, Linux 5.14+: the whole cgroup at once
        if self.version == "v2" and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def create(memory_bytes: int) -> MemoryCgroup | None:
    """A new cgroup holding `memory_bytes`, or None where the host offers none.

    Raises OSError when the host offers cgroups but this one cannot be made: the caller
    refuses the sandbox rather than run it without its limit.
    """
    found = support()
    if found.version is None or found.parent is None:
        return None
    return _make(found.version, found.parent, memory_bytes)


def _make(version: str, parent: Path, memory_bytes: int) -> MemoryCgroup:
    path = parent / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    cg = MemoryCgroup(path, version, memory_bytes)
    try:
        for name, value, required in _limit_plan(version, memory_bytes):
            target = path / name
            if required or target.exists():  # no swap files where swap is not accounted
                target.write_text(value)
    except BaseException:
        cg.remove()
        raise
    return cg


def support() -> Support:
    """Probed once per process (a real cgroup is made and a shell moved into it) and logged
    once: the API's threads may ask together."""
    global _known
    with _lock:
        if _known is None:
            _known = _probe()
            level = logging.WARNING if _known.version is None else logging.INFO
            log.log(level, "python verifier sandboxes: %s", _known.describe())
        return _known


def forget() -> None:
    """Probe again at the next support() (tests, after changing GRPO_SANDBOX_CGROUP)."""
    global _known
    with _lock:
        _known = None


def _probe() -> Support:
    explicit = os.environ.get(CGROUP_ENV, "").strip()
    if explicit:
        parent = Path(explicit)
        if (parent / "cgroup.controllers").is_file():
            return _try("v2", parent)
        if (parent / "memory.limit_in_bytes").is_file():
            return _try("v1", parent)
        return Support(None, reason=f"{CGROUP_ENV}={explicit} is no memory cgroup directory")
    try:
        mounts = _mounts()
        own = _own_cgroups()
    except OSError as exc:
        return Support(None, reason=f"cannot read the process's cgroups: {exc}")
    # The memory controller is in one hierarchy only: v2 where its root offers it, else v1.
    for point, root, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        if "memory" in _read(Path(point, "cgroup.controllers")).split():
            return _try("v2", _under(point, root, own[""]))
    for point, root, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in own:
            return _try("v1", _under(point, root, own["memory"]))
    return Support(None, reason="no cgroup memory controller is mounted")


def _try(version: str, parent: Path) -> Support:
    """Make a cgroup under `parent` and move a shell into it: the whole path a sandbox takes."""
    try:
        if version == "v2":
            _delegate_memory(parent)
        _sweep(parent)
        cg = _make(version, parent, PROBE_BYTES)
        try:
            done = subprocess.run(
                [SHELL, "-c", 'echo 0 > "$0"', str(cg.procs)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
            )
        finally:
            cg.remove()
        if done.returncode != 0:
            shown = done.stderr.decode(errors="replace").strip()[:200]
            raise OSError(f"cannot move a process into it ({shown or done.returncode})")
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(None, reason=f"cgroup {version} at {parent}: {exc}")
    return Support(version, parent)


def _delegate_memory(parent: Path) -> None:
    control = parent / "cgroup.subtree_control"
    if "memory" in _read(control).split():
        return
    try:
        control.write_text("+memory")
    except OSError as exc:
        raise OSError(
            f"it does not delegate the memory controller to its children ({exc.strerror}; a "
            f"cgroup that holds processes cannot); set {CGROUP_ENV} to one that does"
        ) from None


def _sweep(parent: Path) -> None:
    """Remove the empty cgroups of sandboxes whose worker died without cleaning up."""
    for path in parent.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                os.rmdir(path)  # refused while anything still runs inside


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root within its hierarchy, fs type, super options) of cgroup mounts."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((_unescape(fields[4]), _unescape(fields[3]), rest[0], rest[2]))
    return out


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per controller; '' is the v2 (unified) one."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            own[""] = path
        for name in filter(None, controllers.split(",")):
            own[name] = path
    return own


def _under(point: str, root: str, path: str) -> Path:
    """The directory of cgroup `path` where its hierarchy's `root` is mounted at `point`."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return Path(point, path.lstrip("/"))
