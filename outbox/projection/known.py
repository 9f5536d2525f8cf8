"""The projectors the database knows: what the workers that apply record as they start, and
an operator's retirement of one.

A worker records every projector it runs (its subscribed types, ordered, transactional), so
the database knows a projector as soon as one worker of a deploy runs it, and keeps knowing it
while older workers without it still run. A projector leaves only by `retire` (audited beside
pauses and resumes, optionally dropping its checkpoints and markers): never because one
worker's code lacks it. It owns every statement on `outbox_projectors`; it never runs a
projector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING

import orjson

from outbox import db
from outbox.queries import Queries
from outbox.queue.holds import delete_projector_holds
from outbox.queue.settle import refresh_campaigns, settle

if TYPE_CHECKING:
    from outbox.db import Connection, Executor
    from outbox.projection.registry import Registry

__all__ = [
    "AbsentProjectors",
    "KnownProjector",
    "Retired",
    "list_known",
    "owe_nothing",
    "record",
    "retire",
]


class KnownQueries(Queries):
    record_projectors: str
    list_projectors: str
    retire_projector: str
    delete_checkpoints: str
    delete_markers: str


Q = KnownQueries


@dataclass(frozen=True, slots=True)
class KnownProjector:
    """A recorded projector: what the last worker to start with it said, and when; where it
    started when first seen (S25)."""

    projector: str
    events: list[str]
    ordered: bool
    transactional: bool
    start: str
    first_seen_at: datetime
    last_seen_at: datetime
    last_seen_by: str
    paused: bool
    # The declared name, this version of it, and the version's state (S29): live, superseded
    # (owed no work) or building.
    base: str
    version: int
    state: str


@dataclass(frozen=True, slots=True)
class Retired:
    """`maintenance projector-retire`: the record as it was, the guards dropped with it
    (checkpoints, markers; 0 when they were kept), and whether its read model was dropped."""

    record: KnownProjector
    checkpoints: int
    markers: int
    # Whether its `drop` hook dropped its read model (a superseded version, the app given).
    dropped: bool = False


def _known(r: db.Record) -> KnownProjector:
    return KnownProjector(
        r["projector"],
        list(r["events"]),
        r["ordered"],
        r["transactional"],
        r["start"],
        r["first_seen_at"],
        r["last_seen_at"],
        r["last_seen_by"],
        r["paused"],
        r["base"],
        r["version"],
        r["state"],
    )


async def record(executor: Executor, registry: Registry, worker_id: str) -> list[str]:
    """Record `registry`'s projectors as run by `worker_id`; the names seen for the first time."""
    document = [
        {
            "projector": p.name,
            "events": sorted(p.events),
            "ordered": p.ordered,
            "transactional": p.transactional,
            "start": p.start,
        }
        for p in registry.projectors.values()
    ]
    if not document:
        return []
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.record_projectors, orjson.dumps(document).decode(), worker_id)
    return sorted(r["projector"] for r in rows if r["new"])


async def list_known(executor: Executor) -> list[KnownProjector]:
    async with db.acquire(executor) as conn:
        return [_known(r) for r in await conn.fetch(Q.list_projectors)]


async def retire(
    conn: Connection, projector: str, *, actor: str, reason: str, drop_guards: bool
) -> Retired | None:
    """Retire `projector` (audited), dropping its holds (and the rows that stood for them
    alone) and, when `drop_guards`, its checkpoints and markers, all in the caller's
    transaction; None when it is not recorded."""
    row = await conn.fetchrow(Q.retire_projector, projector, actor, reason)
    if row is None:
        return None
    await owe_nothing(conn, projector)
    checkpoints = markers = 0
    if drop_guards:
        checkpoints = db.affected(await conn.execute(Q.delete_checkpoints, projector))
        markers = db.affected(await conn.execute(Q.delete_markers, projector))
    return Retired(_known(row), checkpoints, markers)


async def owe_nothing(conn: Connection, projector: str) -> int:
    """`projector` owes nothing from now on (retired, or a superseded version): its holds go,
    the rows that stood for them alone with them (S24), in the caller's transaction; the holds
    gone."""
    gone = await delete_projector_holds(conn, projector)
    if gone:
        await settle(conn, released=gone)
        await refresh_campaigns(conn, sorted({cid for cid, _, _ in gone}), park=True)
    return len(gone)


@dataclass
class AbsentProjectors:
    """The projectors the database knows that an applier's code lacks (a rolling deploy runs
    workers with and without a projector): their share of an event waits in holds for a
    worker that runs them (S24), never completed on their behalf. Read at most once per
    `interval`."""

    interval: float
    known: tuple[KnownProjector, ...] = ()
    _read_at: float = field(default=float("-inf"), repr=False)

    def expire(self) -> None:
        """Read the record again at the next call."""
        self._read_at = float("-inf")

    async def of(self, conn: Connection, registry: Registry) -> tuple[KnownProjector, ...]:
        """The recorded transactional projectors `registry` lacks (lease-mode ones are
        leased by the workers that run them), superseded versions aside (owed nothing)."""
        if monotonic() - self._read_at >= self.interval:
            self.known = tuple(await list_known(conn))
            self._read_at = monotonic()
        return tuple(
            k
            for k in self.known
            if k.transactional
            and k.state != "superseded"
            and k.projector not in registry.projectors
        )
