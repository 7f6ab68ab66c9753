"""Whether a list+watch can be believed now: listed at least once, no failure since the last
successful (re)connection, and some progress within the progress deadline. Pure: fed with
monotonic times by `vigil.kube.informer`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Freshness:
    """Whether a list+watch can be believed now; pure, fed with monotonic times."""

    deadline: float
    synced: bool = False  # listed at least once
    broken: bool = True  # a failure since the last successful list or watch start
    last_progress: float = float("-inf")

    def progress(self, now: float) -> None:
        self.last_progress = max(self.last_progress, now)

    def recovered(self, now: float) -> None:
        self.broken = False
        self.progress(now)

    def fresh(self, now: float) -> bool:
        return self.synced and not self.broken and now - self.last_progress < self.deadline
