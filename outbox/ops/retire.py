"""Retiring a projector: the database stops counting it among the projectors the workers run
(`outbox.projection.known`), audited beside pauses and resumes, optionally with its guards.

A projector is retired after it is gone from the code of every worker: given the app, a
projector it still has is refused, since a worker that runs it records it again as it starts.
Its read model is the application's to drop; `drop_guards` removes its checkpoints and
processed markers, so a projector deployed later under the same name starts from nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, NotFound, ValidationError
from outbox.ops.requeue import current_actor
from outbox.projection import known
from outbox.projection.known import KnownProjector, Retired

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = ["check_retirement", "list_projectors", "retire_projector"]


def check_retirement(projector: str, reason: str, registry: Registry | None) -> None:
    """Refuse a blank name or reason, and a projector the app (when given) still has."""
    if not projector.strip():
        raise ValidationError("projector", "must not be empty")
    if not reason.strip():
        raise ValidationError("reason", "a retirement needs a reason, for the audit")
    if registry is not None and projector in registry.projectors:
        raise Conflict(
            f"projector {projector!r} is still in the app: remove it from the code and deploy "
            "first (a worker that runs it records it again as it starts)"
        )


async def retire_projector(
    executor: Executor,
    projector: str,
    *,
    reason: str,
    drop_guards: bool = False,
    actor: str | None = None,
    registry: Registry | None = None,
) -> Retired:
    check_retirement(projector, reason, registry)
    async with db.acquire(executor) as conn, conn.transaction():
        retired = await known.retire(
            conn, projector, actor=actor or current_actor(), reason=reason, drop_guards=drop_guards
        )
        if retired is None:
            names = ", ".join(p.projector for p in await known.list_known(conn)) or "none"
            raise NotFound(f"projector {projector!r} is not recorded (recorded: {names})")
    return retired


async def list_projectors(executor: Executor) -> list[KnownProjector]:
    return await known.list_known(executor)
