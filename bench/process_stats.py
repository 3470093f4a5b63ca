"""What `bench/api_load.py` reads of a server's processes from /proc: their CPU time, RSS and
the connections each holds."""

from __future__ import annotations

import os
from pathlib import Path


def _tree(pid: int) -> list[int]:
    """A process and its descendants (the API's processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out


def rss_mib(pid: int) -> float:
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the API's processes: per request, a figure that other load
    on the machine does not distort."""
    ticks = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except FileNotFoundError:
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def connections_per_process(pid: int, port: int) -> list[int]:
    """Established connections to `port` held by each of the server's processes, most first.
    A process holding more of them answers each more slowly (the p99 comes from its share);
    which uvicorn worker accepts a connection is the kernel's choice."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    counts = []
    for p in _tree(pid):
        try:
            links = [os.readlink(f) for f in Path(f"/proc/{p}/fd").iterdir()]
        except (FileNotFoundError, PermissionError):
            continue
        held = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)
        if held:
            counts.append(held)
    return sorted(counts, reverse=True)
