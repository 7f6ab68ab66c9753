"""What /proc says of processes and of the machine: a process's CPU seconds, the machine's busy
CPU, a figure of a process's status, and a sampler of peak resident memory. Standard library
only, so that any bench can read them without loading a client."""

from __future__ import annotations

import contextlib
import os
import threading


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has used since boot, all cores together (the
    first line of /proc/stat, less idle and iowait): the bed, the operator, the bench and the rest."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """VmRSS of some processes every 0.5 s; `peak` is the largest seen, in MiB."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.peak = pids, dict.fromkeys(pids, 0.0)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(0.5)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self.peak[name] = max(self.peak[name], status_kib(pid, "VmRSS") / 1024)

    def stop(self) -> dict[str, float]:
        self.halt.set()
        self.join()
        self.sample()
        return self.peak
