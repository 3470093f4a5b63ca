"""Memory cgroups and the host-wide sandbox cap, through the real sandbox.

Each sandbox lives in its own memory cgroup where the host has one (cgroup v2 delegated, or a
writable v1 memory hierarchy), which goes when the sandbox does; where none is usable the
rlimits alone hold it and the log says so once. Sandboxes of every process on the host count
against GRPO_MAX_SANDBOXES_PER_HOST.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.verifiers import (
    SandboxUnavailableError,
    cgroup,
    open_verifier,
    sandbox_memory,
    sandbox_mode,
    slots,
)
from workers.verifiers.python_kind import ChildLimits, PythonVerifier
from workers.verifiers.sandbox import TMP_BYTES

SOURCE = """
def verify(prompt, completion):
    if completion == "hog":  # 300 MB, touched: well inside RLIMIT_AS (1 GiB)
        data = b"x" * (300 << 20)
        return float(len(data) > 0)
    return 1.0
"""
OK = [{"prompt": "p", "completion": "ok"}]
HOG = [{"prompt": "p", "completion": "hog"}]


def _open(limits: ChildLimits | None = None) -> PythonVerifier:
    v = open_verifier("python", {"source": SOURCE, "timeout_s": 20}, name="mem", limits=limits)
    assert isinstance(v, PythonVerifier)
    return v


def _sandbox_pids(v: PythonVerifier) -> set[int]:
    """bwrap and every process below it."""
    assert v._child is not None
    out, todo = set(), [v._child.proc.pid]
    while todo:
        pid = todo.pop()
        out.add(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


@pytest.fixture
def memory_cgroups() -> cgroup.Support:
    found = cgroup.support()
    if found.version is None:
        pytest.skip(f"this host gives sandboxes no memory cgroup: {found.reason}")
    return found


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    """The probe runs again under the test's environment, and again after it."""
    cgroup.forget()
    yield
    cgroup.forget()


def test_each_sandbox_lives_in_its_own_memory_cgroup_which_goes_with_it(memory_cgroups):
    a, b = _open(), _open()
    try:
        assert a.score(OK) == ([1.0], [None]) and b.score(OK) == ([1.0], [None])
        assert a._child is not None and b._child is not None
        mine, other = a._child.memory, b._child.memory
        assert mine is not None and other is not None and mine.path != other.path
        assert mine.path.parent == memory_cgroups.parent and mine.path.is_dir()
        # Every process of the sandbox is inside, bwrap itself included: none ran outside.
        assert _sandbox_pids(a) == set(mine.pids())
        limit = str(ChildLimits().memory_bytes + TMP_BYTES)  # its address space + its /tmp
        limits = mine.limits()
        if memory_cgroups.version == "v2":
            assert limits["memory.max"] == limit
            assert limits.get("memory.swap.max", "0") == "0"
        else:
            assert limits["memory.limit_in_bytes"] == limit
            assert limits.get("memory.memsw.limit_in_bytes", limit) == limit  # no swap past it
    finally:
        a.close()
        b.close()
    assert not mine.path.exists() and not other.path.exists()


def test_memory_past_the_cgroup_limit_is_killed_with_a_clear_error(memory_cgroups):
    v = _open(ChildLimits(cgroup_memory_bytes=128 << 20))
    try:
        assert v.score(OK) == ([1.0], [None])
        assert v._child is not None and v._child.memory is not None
        first = v._child.memory.path
        scores, errors = v.score(HOG)
        assert scores == [None]
        assert errors[0] is not None and errors[0].startswith("verifier process died"), errors
        assert errors[0].endswith("out of memory (the sandbox's memory limit is 128 MiB)")
        assert not first.exists()
        assert v.score(OK) == ([1.0], [None])  # a fresh sandbox, in a fresh cgroup
        assert v._child is not None and v._child.memory is not None
        second = v._child.memory.path
        assert second != first
    finally:
        v.close()
    assert not second.exists()


def test_the_sandbox_cgroup_setting_says_where_cgroups_go(memory_cgroups, fresh_probe, monkeypatch):
    assert memory_cgroups.parent is not None
    parent = memory_cgroups.parent / f"grpo-test-{secrets.token_hex(4)}"
    parent.mkdir()
    monkeypatch.setenv(cgroup.CGROUP_ENV, str(parent))
    try:
        v = _open()
        try:
            assert v.score(OK) == ([1.0], [None])
            assert v._child is not None and v._child.memory is not None
            assert v._child.memory.path.parent == parent
            assert str(parent) in sandbox_memory()
        finally:
            v.close()
        assert [p.name for p in parent.iterdir() if p.name.startswith(cgroup.PREFIX)] == []
    finally:
        os.rmdir(parent)


def test_without_a_usable_cgroup_the_rlimits_hold_and_the_log_says_so_once(
    fresh_probe, monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv(cgroup.CGROUP_ENV, str(tmp_path))  # a plain directory, not a cgroup
    with caplog.at_level(logging.INFO, logger="workers.verifiers.cgroup"):
        assert sandbox_mode() == "bubblewrap"  # where the worker first tells the mode
        v = _open()
        try:
            assert v.score(OK) == ([1.0], [None])
            assert v._child is not None and v._child.memory is None
            assert v.score([{"prompt": "p", "completion": "x" * 10}]) == ([1.0], [None])
        finally:
            v.close()
        assert sandbox_memory().startswith("no memory cgroup, rlimits only")
    said = [r for r in caplog.records if r.name == "workers.verifiers.cgroup"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert str(tmp_path) in said[0].getMessage()


HOLD_A_SLOT = """
import sys, time
from pathlib import Path
from workers.verifiers import slots
slots.SLOTS_DIR = Path(sys.argv[1])
slot = slots.acquire(int(sys.argv[2]))
print(slot.index, flush=True)
time.sleep(120)
"""


def test_the_host_cap_counts_the_sandboxes_of_every_process(tmp_path, monkeypatch):
    folder = tmp_path / "slots"  # this test's own host count, whatever else runs here
    monkeypatch.setattr(slots, "SLOTS_DIR", folder)
    monkeypatch.setattr(slots, "WAIT_S", 0.3)
    monkeypatch.setenv(slots.HOST_CAP_ENV, "2")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_SLOT, str(folder), "2"], stdout=subprocess.PIPE
    )
    a, b = _open(), _open()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"0"
        assert a.score(OK) == ([1.0], [None])  # the second and last slot
        with pytest.raises(SandboxUnavailableError, match=r"^2 python verifier sandboxes "
                           r"already run on this host.*GRPO_MAX_SANDBOXES_PER_HOST=2"):  # fmt: skip
            b.score(OK)
        holder.kill()  # a process that dies, however it dies, frees its slots
        holder.wait()
        assert b.score(OK) == ([1.0], [None])  # in the holder's slot 0
        a.close()  # a closed verifier frees its slot too
        freed = slots.acquire(2, wait_s=0)
        assert freed.index == 1
        freed.release()
    finally:
        holder.kill()
        holder.wait()
        a.close()
        b.close()
