"""The peak memory a run measures, reported with every step's metrics as
`peak_memory_bytes`: the check on the memory plan estimated at submission (`memory.py`)."""

from __future__ import annotations

import torch


class MemoryMeter:
    """The run's peak memory: CUDA's allocator peak on a GPU; on a CPU the peak resident set
    (VmHWM, reset at start where the kernel allows) above what the process held at start."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            self.device, self.base = device, 0
            return
        self.base = _status_bytes("VmRSS")
        try:  # "5" resets the peak resident set to the current one (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError:
            pass

    def peak(self) -> int:
        if self.cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        return max(0, _status_bytes("VmHWM") - self.base)


def _status_bytes(key: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
