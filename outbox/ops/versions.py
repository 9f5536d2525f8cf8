"""Promoting a projector's version (S29): the operator's one step that makes a version the
one readers read, audited beside pauses and retirements.

The promotion is refused while the version is not caught up (the error says what it lacks),
unless forced; the versions below it are owed nothing from its commit on. It waits at most
five seconds for the batches in flight (a busy apply path is a Conflict to try again), so it
never stalls the workers behind a batch stuck in a projector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, ValidationError
from outbox.ops.requeue import current_actor
from outbox.projection import versions
from outbox.projection.versions import Promoted

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["check_version", "promote_version"]


def check_version(projector: str, version: int) -> None:
    """Refuse a blank name and a version below 1, before any connection."""
    if not projector.strip():
        raise ValidationError("projector", "must not be empty")
    if version < 1:
        raise ValidationError("version", f"must be a whole number from 1, not {version}")


async def promote_version(
    executor: Executor,
    projector: str,
    version: int,
    *,
    reason: str | None = None,
    force: bool = False,
    actor: str | None = None,
) -> Promoted:
    """Make `version` of `projector` live (see `outbox.projection.versions.promote`)."""
    check_version(projector, version)
    try:
        async with db.acquire(executor) as conn, conn.transaction():
            return await versions.promote(
                conn,
                projector,
                version,
                actor=actor or current_actor(),
                reason=reason,
                force=force,
            )
    except Exception as exc:
        if db.sqlstate_of(exc) == "55P03":
            raise Conflict(
                "a batch held the versions' lock for more than 5 s (a projector running long?): "
                "nothing changed; try the promotion again"
            ) from None
        raise
