"""Live first (issue 60): the catch-up engine's pace, set by how the live path keeps up.

The engine (`build.py`) runs a pass over history beside live appends and workers; on a small
server it takes the cores and the disk the live path needs. `LivePace` reads, between steps,
how long the live path's oldest due campaign has waited, and slows the engine (or waits) while
the live workers fall behind, speeding up again while they keep up. `--max-rate`
(`builds.Throttle`) caps it on top.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

from outbox import db
from outbox.queries import Queries

__all__ = ["LivePace"]


class PaceQueries(Queries):
    get_live_wait: str


Q = PaceQueries


@dataclass
class LivePace:
    """Live first (issue 60): the engine yields to the live path by itself. Between steps,
    at most every `every` seconds, it reads how long the live path's oldest due campaign has
    waited (`get_live_wait`); past `target` the live workers are falling behind, so it halves
    its pace (from the rate it ran at, down to `floor` events/s) and waits that long; under it,
    it raises its pace by a quarter, and past `ceiling` runs unpaced again (AIMD, as TCP does).
    `paced` counts the steps it slowed or waited; `--max-rate` (`Throttle`) caps it on top."""

    target: float = 0.05
    every: float = 0.1
    floor: float = 500.0
    ceiling: float = 200_000.0
    longest: float = 1.0  # the longest it waits for the live workers at once
    rate: float | None = None  # events/s now (None: unpaced)
    paced: int = 0
    _read_at: float = float("-inf")
    _step_at: float = field(default_factory=time.monotonic)

    async def step_done(self, conn: db.Connection, events: int) -> None:
        """After a step of `events`: wait as the live path and the pace say."""
        now = time.monotonic()
        took = now - self._step_at  # the step's time (the pace's own waits excluded)
        if now - self._read_at >= self.every:
            self._read_at = now
            waited = float(await conn.fetchval(Q.get_live_wait) or 0.0)
            if waited > self.target:
                ran = events / took if took > 0 and events else self.floor
                self.rate = max(self.floor, min(self.rate or ran, ran) / 2)
                self.paced += 1
                await anyio.sleep(min(waited, self.longest))  # the live path catches up
            elif self.rate is not None:
                self.rate = None if self.rate * 1.25 > self.ceiling else self.rate * 1.25
        if self.rate is not None and events:
            ahead = events / self.rate - took
            if ahead > 0:
                self.paced += 1
                await anyio.sleep(ahead)
        self._step_at = time.monotonic()
