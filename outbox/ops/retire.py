"""Retiring a projector: the database stops counting it among the projectors the workers run
(`outbox.projection.known`), audited beside pauses and resumes, optionally with its guards.

A projector is retired after it is gone from the code of every worker: given the app, a
projector it still has is refused, since a worker that runs it records it again as it starts.
Its read model is the application's to drop; `drop_guards` removes its checkpoints and
processed markers, so a projector deployed later under the same name starts from nothing.

A superseded version (S29) is retired whenever the operator likes, the app still having it or
not: it is owed nothing already. Its checkpoints and markers always go with it, and its `drop`
hook, when the app given has it, drops its read model in the same transaction. The live
version is refused while another version of the projector is recorded: promote one first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, ValidationError
from outbox.ops.requeue import current_actor
from outbox.ops.versions import check_version
from outbox.projection import known
from outbox.projection.known import KnownProjector, Retired
from outbox.projection.registry import track_name

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = ["check_retirement", "list_projectors", "retire_projector"]


def check_retirement(projector: str, reason: str, version: int | None = None) -> None:
    """Refuse a blank name or reason and a version below 1, before any connection."""
    check_version(projector, 1 if version is None else version)
    if not reason.strip():
        raise ValidationError("reason", "a retirement needs a reason, for the audit")


def _refuse(
    record: KnownProjector, siblings: list[KnownProjector], registry: Registry | None
) -> None:
    """Refuse the live version while another is recorded, and a version the app (when given)
    still has unless it is superseded."""
    if record.state == "superseded":
        return
    if registry is not None and record.projector in registry.projectors:
        raise Conflict(
            f"projector {record.projector!r} is still in the app: remove it from the code and "
            "deploy first (a worker that runs it records it again as it starts)"
        )
    others = [k.version for k in siblings if k.projector != record.projector]
    if record.state == "live" and others:
        raise Conflict(
            f"version {record.version} of projector {record.base!r} is the live one, and "
            f"version(s) {', '.join(map(str, others))} are recorded: promote one first "
            "(maintenance projector-promote)"
        )


async def retire_projector(
    executor: Executor,
    projector: str,
    *,
    reason: str,
    drop_guards: bool = False,
    actor: str | None = None,
    registry: Registry | None = None,
    version: int | None = None,
) -> Retired:
    """Retire `projector` (its `version`, when given: `roster` version 2 is `roster@v2`)."""
    check_retirement(projector, reason, version)
    key = projector if version is None else track_name(projector, version)
    async with db.acquire(executor) as conn, conn.transaction():
        record = await known.require_recorded(conn, key)
        recorded = await known.list_known(conn)
        _refuse(record, [k for k in recorded if k.base == record.base], registry)
        superseded = record.state == "superseded"
        retired = await known.retire(
            conn,
            key,
            actor=actor or current_actor(),
            reason=reason,
            drop_guards=drop_guards or superseded,
        )
        assert retired is not None  # recorded above, in this transaction
        # The app has it only when it is superseded (refused above otherwise).
        registered = registry.projectors.get(key) if registry is not None else None
        hook = registered.drop if registered is not None else None
        if hook is not None:
            await hook(conn)
    return replace(retired, dropped=hook is not None)


async def list_projectors(executor: Executor) -> list[KnownProjector]:
    return await known.list_known(executor)
