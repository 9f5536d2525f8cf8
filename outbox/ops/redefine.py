"""Recording a change of a projector's definition that is safe in place (S33): the operator's
explicit, audited step for a change that alters neither what the projector owes nor how it is
guarded (where it starts, its kind among the transactional ones, a SQL projector's function).

Any other change is refused here, as it is at a worker's start: it ships as a new version
(S29). Once recorded, the workers still running the old definition stop running the projector
within a poll interval, and its share waits in holds for the workers that run the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import NotFound, ValidationError
from outbox.ops.requeue import current_actor
from outbox.ops.versions import check_version
from outbox.projection import known
from outbox.projection.registry import track_name

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = ["Redefined", "check_redefinition", "redefine_projector"]


@dataclass(frozen=True, slots=True)
class Redefined:
    """A redefinition: the projector's key, each change (`field recorded -> new`; none when the
    record already said so) and the fingerprint recorded now."""

    projector: str
    changes: list[str]
    fingerprint: str


def check_redefinition(projector: str, reason: str, version: int | None = None) -> None:
    """Refuse a blank name or reason and a version below 1, before any connection."""
    check_version(projector, 1 if version is None else version)
    if not reason.strip():
        raise ValidationError("reason", "a redefinition needs a reason, for the audit")


async def redefine_projector(
    executor: Executor,
    projector: str,
    *,
    registry: Registry,
    reason: str,
    version: int | None = None,
    actor: str | None = None,
) -> Redefined:
    """Record the app's definition of `projector` (its `version`) in place of the recorded one:
    a ConfigError when a change is not safe in place, NotFound when the app or the database
    lacks it."""
    check_redefinition(projector, reason, version)
    key = projector if version is None else track_name(projector, version)
    registered = registry.projectors.get(key)
    if registered is None:
        names = ", ".join(sorted(registry.projectors)) or "none"
        raise NotFound(f"projector {key!r} is not in the app (the app has: {names})")
    async with db.acquire(executor) as conn, conn.transaction():
        found = await known.redefine(
            conn, registered, actor=actor or current_actor(), reason=reason
        )
    if found is None:
        raise NotFound(
            f"projector {key!r} is not recorded: a worker records its definition as it starts"
        )
    recorded = await known.require_recorded(executor, key)
    return Redefined(key, [c.describe() for c in found], recorded.fingerprint or "")
