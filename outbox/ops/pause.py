"""Pausing and resuming a projector: an operator's hold while a projector or what it writes to
is being fixed (see `outbox.projection.pauses` for what appliers do with it).

A pause records who and why; the events the projector subscribes to wait, consuming no
attempt, and under campaign ordering so does the rest of their campaigns. The name is checked
against the app's projectors when the app (`registry`) is given, else against the database's
record, so a typo cannot pause nothing (NotFound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox.errors import NotFound, ValidationError
from outbox.ops.requeue import current_actor
from outbox.projection import pauses
from outbox.projection.known import require_recorded
from outbox.projection.pauses import Pause, PauseEntry

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = ["Paused", "Pauses", "Resumed", "list_paused", "pause_projector", "resume_projector"]


@dataclass(frozen=True, slots=True)
class Paused:
    """`maintenance projector-pause`: the pause in force; `created` false when the projector
    was already paused (the first pause stands)."""

    projector: str
    created: bool
    pause: Pause


@dataclass(frozen=True, slots=True)
class Resumed:
    """`maintenance projector-resume`: `resumed` false when the projector was not paused."""

    projector: str
    resumed: bool
    pause: Pause | None


@dataclass(frozen=True, slots=True)
class Pauses:
    """`maintenance projector-pauses`: every pause in force, and the latest pauses and resumes."""

    pauses: list[Pause]
    history: list[PauseEntry]


async def _check(executor: Executor, projector: str, registry: Registry | None) -> None:
    """A blank name is a ValidationError; a name neither the app given (`registry`) nor,
    without one, the database knows (recorded, or paused now) is NotFound: a typo pauses
    nothing. A projector not recorded yet is paused by naming the app that has it (before any
    worker runs it)."""
    if not projector.strip():
        raise ValidationError("projector", "must not be empty")
    if registry is None:
        if not any(p.projector == projector for p in await pauses.list_pauses(executor)):
            await require_recorded(executor, projector)
    elif projector not in registry.projectors:
        known = ", ".join(sorted(registry.projectors)) or "none"
        raise NotFound(f"projector {projector!r} is not a projector of the app ({known})")


async def pause_projector(
    executor: Executor,
    projector: str,
    *,
    reason: str | None = None,
    actor: str | None = None,
    registry: Registry | None = None,
) -> Paused:
    await _check(executor, projector, registry)
    actor = actor or current_actor()
    found, created = await pauses.pause(executor, projector, actor=actor, reason=reason)
    return Paused(projector, created, found)


async def resume_projector(
    executor: Executor,
    projector: str,
    *,
    reason: str | None = None,
    actor: str | None = None,
    registry: Registry | None = None,
) -> Resumed:
    await _check(executor, projector, registry)
    found = await pauses.resume(executor, projector, actor=actor or current_actor(), reason=reason)
    return Resumed(projector, found is not None, found)


async def list_paused(executor: Executor, *, history: int = 50) -> Pauses:
    return Pauses(
        await pauses.list_pauses(executor), await pauses.list_pause_audit(executor, limit=history)
    )
