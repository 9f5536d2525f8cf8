"""How many claim loops a worker runs: its `concurrency` always, more while a backlog lasts.

A worker starts `floor` claim loops (OUTBOX_CONCURRENCY). A batch that comes back full says
more is waiting than the running loops take (`backlog`): the loop that ran it starts one more,
up to `ceiling` (OUTBOX_MAX_CONCURRENCY; unset, `outbox-worker` grows to `AUTO_CEILING` or its
concurrency when that is larger, since its pool is its own, and a worker embedded on an
application's pool keeps its concurrency: `ceiling_of`). A loop started so ends at its first
batch that finds no backlog (one that would wait for a wake-up, a backoff or an append in
flight), so the loops come back to the floor as the backlog drains. Each loop is a connection
and a transaction at a time; order per campaign and every guard are the claim's and the
settle's, whatever the number of loops (S10).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from outbox.config import Settings
from outbox.model import BatchCounts
from outbox.worker.signals import Signal

__all__ = ["AUTO_CEILING", "Loops", "backlog", "ceiling_of"]

# The most claim loops a worker process grows to, unless OUTBOX_MAX_CONCURRENCY says otherwise:
# past it, on the machines measured, more loops drained no faster (docs/performance.md).
AUTO_CEILING = 4


def ceiling_of(settings: Settings, *, own_pool: bool) -> int:
    """The most claim loops a worker with `settings` runs: OUTBOX_MAX_CONCURRENCY when set
    (never below the concurrency, which validation refuses); else `AUTO_CEILING` for a worker
    whose pool is its own (`own_pool`), and the concurrency alone for one on an application's
    pool, whose connections the application sized and uses too."""
    if settings.max_concurrency is not None:
        return max(settings.max_concurrency, settings.concurrency)
    return max(settings.concurrency, AUTO_CEILING) if own_pool else settings.concurrency


def backlog(counts: BatchCounts, *, batch_size: int) -> bool:
    """Whether a batch says more is waiting than the running loops take: it came back full.
    (A claim that met its campaign limit is no such sign: under live load spread over many
    campaigns it does so with a few events, and more loops then only share the machine's CPU:
    bench/latency.py measured p50 1.2-1.9x with loops grown so.)"""
    return counts.claimed >= batch_size


@dataclass
class Loops:
    """The claim loops running now: `floor` of them always, up to `ceiling` while a backlog
    lasts. `start` (set by the service's task group) starts one more, elastic loop."""

    floor: int
    ceiling: int
    running: int = 0
    peak: int = 0  # the most loops that ran at once
    start: Callable[[], None] | None = field(default=None, repr=False)
    changed: Signal = field(default_factory=Signal, repr=False)  # after every start and end
    on_change: Callable[[int], None] = field(default=lambda _n: None, repr=False)

    def started(self) -> None:
        """A loop starts (counted when it is asked for, so a drain never ends between)."""
        self.running += 1
        self.peak = max(self.peak, self.running)
        self._changed()

    def ended(self) -> int:
        """A loop ended; how many run still."""
        self.running -= 1
        self._changed()
        return self.running

    def grow(self) -> bool:
        """One more loop, if below the ceiling and the service lets loops start."""
        if self.start is None or self.running >= self.ceiling:
            return False
        self.started()
        self.start()
        return True

    def _changed(self) -> None:
        self.on_change(self.running)
        self.changed.fire()
