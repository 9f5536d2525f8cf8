"""Discarding a dead row: an operator's decision that an event will not be projected.

The work row is deleted with an insert-only audit row (action `discard`, actor, reason, what
the row was). The event stays in the journal, so a rebuild can still project it. Every ordered
projector's checkpoint in the campaign moves past the discarded seq, so the campaign's later
rows apply instead of meeting a gap (S17); a projector whose checkpoint is still before the
event's predecessor has not applied the events before it, and the discard is refused. The
campaign row then follows the rows left. Only a dead row can be discarded: a pending or failed
one is still the workers'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, ValidationError
from outbox.ops.requeue import current_actor
from outbox.projection.guards import lock_checkpoints
from outbox.queue import repair
from outbox.queue.claim import claim_one
from outbox.queue.settle import notify_work, refresh_campaigns, settle

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.projection.registry import Registry

__all__ = ["Discarded", "check_reason", "discard_one"]


@dataclass(frozen=True, slots=True)
class Discarded:
    """A discarded row as it was, and the ordered projectors whose checkpoint moved past it."""

    campaign_id: str
    seq: int
    event_type: str
    attempt_count: int
    last_error: str | None
    reason: str
    checkpoints_moved: list[str]


def check_reason(reason: str) -> None:
    """A discard is audited with why: a blank reason is refused (ValidationError)."""
    if not reason.strip():
        raise ValidationError("reason", "a discard needs a reason, for the audit")


async def discard_one(
    executor: Executor,
    registry: Registry,
    campaign_id: str,
    seq: int,
    *,
    reason: str,
    actor: str | None = None,
) -> Discarded:
    """Discard one dead row in one transaction (see the module docstring). NotFound when there
    is no such row; Conflict when it is not dead, a running batch holds it, or an ordered
    projector has not reached the event before it."""
    check_reason(reason)
    async with db.acquire(executor) as conn:
        async with conn.transaction():
            row, _ = await claim_one(conn, campaign_id, seq, park=True)
            if row.status != "dead":
                raise Conflict(f"row {campaign_id!r} seq {seq} is {row.status}, not dead")
            moves: list[tuple[str, str, int]] = []
            if ordered := registry.ordered_names():
                # The campaign row is held (claim_one): no applier runs in it meanwhile.
                found = await lock_checkpoints(conn, [campaign_id], ordered, held=True)
                for name in ordered:
                    at = found.get((campaign_id, name), 0)
                    if at < seq - 1:
                        raise Conflict(
                            f"projector {name!r} is at seq {at} of campaign {campaign_id!r}: "
                            f"the events before seq {seq} are not applied yet"
                        )
                    if at == seq - 1:
                        moves.append((campaign_id, name, seq))
            gone = await repair.discard_dead_row(
                conn, campaign_id, seq, actor=actor or current_actor(), reason=reason
            )
            assert gone is not None  # locked and dead above
            await settle(conn, checkpoints=moves)
            await refresh_campaigns(conn, [campaign_id], park=True)
        await notify_work(conn)
    return Discarded(
        campaign_id,
        seq,
        gone.event_type,
        gone.attempt_count,
        gone.last_error,
        reason,
        [name for _, name, _ in moves],
    )
