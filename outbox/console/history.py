"""The overview's last hour: applied events per second and the oldest claimable head's age,
one sample per read of the shared poller, kept in memory (since the console started, at most
an hour), and the polylines the overview draws them with.

Applied events/s is the change of the live workers' `applied` counters (their heartbeats)
between two reads, per worker: a worker that restarted or went away contributes nothing to
that step rather than a negative rate. No SQL and no HTML here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["HOUR", "Sample", "Trend", "polyline"]

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One read: when, the applied events per second since the read before, and the lag."""

    at: datetime
    applied_per_second: float | None  # None: the first read, or no live worker
    oldest_claimable_age_seconds: float | None  # None: nothing claimable


@dataclass
class Trend:
    """The samples of the last hour, newest last (see the module)."""

    samples: deque[Sample] = field(default_factory=deque)
    _last: tuple[datetime, dict[str, int]] | None = field(default=None, repr=False)

    def add(self, at: datetime, applied: dict[str, int], oldest_age: float | None) -> None:
        """A read at `at`: each live worker's `applied` counter, and the lag."""
        rate = self._rate(self._last, at, applied) if self._last is not None else None
        self.samples.append(Sample(at, rate, oldest_age))
        self._last = (at, applied)
        while (at - self.samples[0].at).total_seconds() > HOUR:
            self.samples.popleft()

    @staticmethod
    def _rate(
        before: tuple[datetime, dict[str, int]], at: datetime, applied: dict[str, int]
    ) -> float | None:
        seconds = (at - before[0]).total_seconds()
        if seconds <= 0 or not applied:
            return None
        was = before[1]
        steps = [n - was[worker] for worker, n in applied.items() if worker in was]
        return sum(max(step, 0) for step in steps) / seconds


def polyline(values: list[float | None], *, width: int, height: int) -> str:
    """SVG polyline points for `values` spread over `width`, scaled to `height` (the largest
    value at the top; missing values are skipped)."""
    present = [v for v in values if v is not None]
    if len(values) < 2 or not present:
        return ""
    top = max(present) or 1.0
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - v / top * height:.1f}"
        for i, v in enumerate(values)
        if v is not None
    )
