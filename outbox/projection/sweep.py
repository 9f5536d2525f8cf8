"""The catch-up sweep (S25): a projector that starts at the beginning reaches every campaign
of the journal, dormant ones too, with no operator and no rebuild.

When a worker first records a projector with `start="beginning"`, the database starts its
sweep: the workers that run it step through `campaign_heads` in key order, a chunk at a
time (`outbox_sweep`, sweep_fn.sql), and give each campaign it is behind on a catch-up hold.
From there the worker's own machinery does the work: a due catch-up hold has the batch take the
projector on from its checkpoint through the journal (at most `HEAL_EVENTS` a batch, the
checkpoint as the resume point), while the campaign's other projectors go on (S24). Campaigns
with work rows are left to an ordered projector's claim, which heals it from the journal up to
them. An unordered projector (with markers) catches up on those too: its checkpoint is a
cursor through the journal, and its markers skip the events its rows gave it. A step seeds
nothing while `OUTSTANDING` catch-up holds of the projector wait, so the sweep keeps pace with
the workers and the holds stay few however long the journal.

It owns the sweep's statements and the progress the report shows (`catch_ups`); it never runs
a projector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING

from outbox import db
from outbox.projection.guards import projector_lag
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = [
    "CAMPAIGNS",
    "OUTSTANDING",
    "CatchUp",
    "Sweeps",
    "catch_up_holds",
    "catch_ups",
]

# Campaigns one step of a sweep looks at, and the catch-up holds of a projector past which a
# step seeds none.
CAMPAIGNS = 500
OUTSTANDING = 1024
# Steps one call takes at most past campaigns that need no hold (a sweep over campaigns the
# projector is level with already).
STEPS = 20


class SweepQueries(Queries):
    sweep_projector: str
    list_sweeps: str
    count_catch_up_holds: str


Q = SweepQueries


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A projector that starts at the beginning, as the report shows it: when it was first
    seen, when its sweep reached the last campaign (None: under way), its catch-up holds not
    yet done; and, while it catches up, the journal's campaigns, those with no event of its
    types left to apply, and the events of its types it has still to apply (None once caught
    up: not counted)."""

    projector: str
    first_seen_at: datetime
    swept_at: datetime | None
    holds: int
    campaigns: int | None
    done: int | None
    events_behind: int | None

    @property
    def catching_up(self) -> bool:
        return self.swept_at is None or self.holds > 0


async def catch_up_holds(executor: Executor) -> dict[str, int]:
    """Each projector's catch-up holds not yet dead: the campaigns it is catching up on."""
    async with db.acquire(executor) as conn:
        return {r["projector"]: r["holds"] for r in await conn.fetch(Q.count_catch_up_holds)}


async def catch_ups(executor: Executor, *, progress: bool = True) -> list[CatchUp]:
    """Every projector that starts at the beginning, with its progress while it catches up
    (`progress`: `guards.projector_lag` each, a pass over the campaigns' heads and its
    checkpoints; without it, only whether it catches up)."""
    async with db.acquire(executor) as conn:
        sweeps = await conn.fetch(Q.list_sweeps)
        if not sweeps:
            return []
        holds = await catch_up_holds(conn)
        found: list[CatchUp] = []
        for r in sweeps:
            name = r["projector"]
            held = holds.get(name, 0)
            campaigns = done = events = None
            if progress and (r["swept_at"] is None or held):
                lag = await projector_lag(conn, name, r["events"])
                campaigns, events = lag.campaigns, lag.events_behind
                done = lag.campaigns - lag.campaigns_behind
            found.append(
                CatchUp(name, r["first_seen_at"], r["swept_at"], held, campaigns, done, events)
            )
        return found


@dataclass
class Sweeps:
    """A worker's part in the sweeps of the projectors it runs that start at the beginning:
    a step of each not yet swept when the worker finds nothing due, else at most once per
    `interval`. Once a sweep is done this worker never steps it again."""

    interval: float
    pending: set[str] = field(default_factory=set)
    _stepped_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def of(cls, registry: Registry, interval: float, *, applies: bool) -> Sweeps:
        """The sweeps of `registry`'s unordered projectors, for a worker that `applies` (a
        shadow worker steps none; the engine catches up the ordered ones, `worker.catch_ups`)."""
        names = {p.name for p in registry.projectors.values() if p.sweeps and not p.ordered}
        return cls(interval, names if applies else set())

    async def step(self, executor: Executor, *, idle: bool) -> tuple[int, bool]:
        """Step every sweep still pending (`idle`: whatever the time since the last step),
        each on past campaigns it is not behind on, up to `STEPS` steps; the catch-up holds
        placed, and whether some sweep moved on and is not done (more steps to come)."""
        if not self.pending or (not idle and monotonic() - self._stepped_at < self.interval):
            return 0, False
        self._stepped_at = monotonic()
        seeded, moving = 0, False
        async with db.acquire(executor) as conn:
            for name in sorted(self.pending):
                for _ in range(STEPS):
                    row = await conn.fetchrow(Q.sweep_projector, name, CAMPAIGNS, OUTSTANDING)
                    assert row is not None  # the function returns one row
                    seeded += row["seeded"]
                    if row["swept"]:
                        self.pending.discard(name)
                        break
                    if row["seeded"] or not row["reached"]:
                        break  # holds to work through, or at its bound, or stepped elsewhere
                else:
                    moving = True
        return seeded, moving
