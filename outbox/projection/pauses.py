"""Paused projectors: an operator's hold on one projector, and what appliers make of it.

A pause is a row of `outbox_projector_pauses`: who paused the projector, when
and why. Appliers (the worker's batches, lease mode, inline apply) read the pauses at most once
per poll interval (`PausedProjectors`). A worker's batch applies the events a paused projector
subscribes to for their other projectors and leaves its share in holds (S24,
`outbox.worker.tracks`); a paused lease-mode projector's events stay where they are, and under
campaign ordering the rest of its campaign waits behind them; inline apply leaves them to the
workers. No attempt is consumed. A worker re-checks such work every poll interval, so a pause
holds within one interval of being set and a resume takes effect within about two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING

from outbox import db
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor
    from outbox.projection.registry import Registry

__all__ = [
    "Pause",
    "PauseEntry",
    "PausedProjectors",
    "list_pause_audit",
    "list_pauses",
    "pause",
    "resume",
]


class PausesQueries(Queries):
    list_paused_projectors: str
    pause_projector: str
    resume_projector: str
    list_projector_audit: str


Q = PausesQueries


@dataclass(frozen=True, slots=True)
class Pause:
    projector: str
    paused_at: datetime
    paused_by: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class PauseEntry:
    """One audited pause or resume."""

    at: datetime
    projector: str
    action: str
    actor: str
    reason: str | None


async def list_pause_audit(executor: Executor, *, limit: int) -> list[PauseEntry]:
    """Pauses and resumes, newest first."""
    async with db.acquire(executor) as conn:
        return [PauseEntry(*r) for r in await conn.fetch(Q.list_projector_audit, limit)]


async def list_pauses(executor: Executor) -> list[Pause]:
    async with db.acquire(executor) as conn:
        return [Pause(*r) for r in await conn.fetch(Q.list_paused_projectors)]


async def pause(
    executor: Executor, projector: str, *, actor: str, reason: str | None
) -> tuple[Pause, bool]:
    """Pause `projector` (audited): the pause in force, and whether this call made it (a
    projector already paused keeps its first pause)."""
    async with db.acquire(executor) as conn:
        row = await conn.fetchrow(Q.pause_projector, projector, actor, reason)
        if row is not None:
            return Pause(*row), True
        found = [p for p in await list_pauses(conn) if p.projector == projector]
    if not found:  # resumed between the two statements: pause it now
        return await pause(executor, projector, actor=actor, reason=reason)
    return found[0], False


async def resume(
    executor: Executor, projector: str, *, actor: str, reason: str | None = None
) -> Pause | None:
    """Lift the pause of `projector` (audited); the pause as it was, or None when it was not
    paused."""
    async with db.acquire(executor) as conn:
        row = await conn.fetchrow(Q.resume_projector, projector, actor, reason)
    return None if row is None else Pause(*row)


@dataclass
class PausedProjectors:
    """The paused projectors as an applier sees them: read at most once per `interval`."""

    interval: float
    names: frozenset[str] = frozenset()
    _read_at: float = field(default=float("-inf"), repr=False)

    async def types(self, conn: Connection, registry: Registry) -> frozenset[str]:
        """The event types a paused projector of `registry` subscribes to (empty: none)."""
        names = await self.projectors(conn, registry)
        return frozenset(t for name in names for t in registry.projectors[name].events)

    async def projectors(self, conn: Connection, registry: Registry) -> frozenset[str]:
        """The paused projectors of `registry` (empty: none)."""
        if monotonic() - self._read_at >= self.interval:
            self.names = frozenset(p.projector for p in await list_pauses(conn))
            self._read_at = monotonic()
        if not self.names:
            return frozenset()
        return frozenset(n for n in self.names if n in registry.projectors)
