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
from outbox.projection.known import require_known
from outbox.queue import repair
from outbox.queue.claim import ClaimedRow, claim_one
from outbox.queue.holds import CATCHING_UP, HoldWrite, RowHold, row_holds
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
    projector: str | None = None,
) -> Discarded:
    """Discard one dead row in one transaction (see the module docstring): `projector`'s hold
    on it (S24), or every holder's (None), or, with no holder, the row itself. NotFound when
    there is no such row; Conflict when it is not dead (for that projector), a running batch
    holds it, or an ordered projector has not reached the event before it."""
    check_reason(reason)
    actor = actor or current_actor()
    async with db.acquire(executor) as conn:
        if projector is not None and projector not in registry.projectors:
            await require_known(conn, projector)  # a typo discards nothing
        async with conn.transaction():
            row, _ = await claim_one(conn, campaign_id, seq, park=True)
            holds = await row_holds(conn, campaign_id, seq)
            if holds or projector is not None:
                return await _discard_holds(
                    conn, registry, row, holds, projector, actor=actor, reason=reason
                )
            if row.status != "dead":
                raise Conflict(f"row {campaign_id!r} seq {seq} is {row.status}, not dead")
            moves = await _moves(conn, registry.ordered_names(), campaign_id, seq)
            gone = await repair.discard_dead_row(conn, campaign_id, seq, actor=actor, reason=reason)
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


async def _moves(
    conn: db.Connection, names: list[str], campaign_id: str, seq: int
) -> list[tuple[str, str, int]]:
    """The checkpoint moves past `seq` of the ordered projectors `names` that are at the event
    before it (Conflict for one that is further behind)."""
    if not names:
        return []
    # The campaign row is held (claim_one): no applier runs in it meanwhile.
    found = await lock_checkpoints(conn, [campaign_id], sorted(names), held=True)
    moves = []
    for name in sorted(names):
        at = found.get((campaign_id, name), 0)
        if at < seq - 1:
            raise Conflict(
                f"projector {name!r} is at seq {at} of campaign {campaign_id!r}: "
                f"the events before seq {seq} are not applied yet"
            )
        if at == seq - 1:
            moves.append((campaign_id, name, seq))
    return moves


async def _discard_holds(
    conn: db.Connection,
    registry: Registry,
    row: ClaimedRow,
    holds: list[RowHold],
    projector: str | None,
    *,
    actor: str,
    reason: str,
) -> Discarded:
    """The dead holds of `projector` (None: every holder's) on `row` go (audited): an ordered
    holder's checkpoint moves past the event and it goes on from there through the journal (a
    hold due now); the row goes with its last hold. The other projectors keep what they
    applied."""
    cid, seq = row.campaign_id, row.seq
    targets = [h for h in holds if projector is None or h.projector == projector]
    if not targets:
        raise Conflict(f"projector {projector!r} holds nothing on row {cid!r} seq {seq}")
    if alive := [h.projector for h in targets if h.status != "dead"]:
        raise Conflict(f"row {cid!r} seq {seq} is not dead for {', '.join(alive)}")
    if unknown := sorted({h.projector for h in targets} - set(registry.projectors)):
        raise Conflict(
            f"projector {', '.join(unknown)} is not in the app given: discard with the app "
            "that runs it (whether its checkpoint moves depends on it)"
        )
    ordered = [h.projector for h in targets if registry.projectors[h.projector].ordered]
    moves = await _moves(conn, ordered, cid, seq)
    await repair.audit_hold_discard(conn, cid, targets, actor=actor, reason=reason)
    await settle(
        conn,
        checkpoints=moves,
        holds=[
            HoldWrite(cid, name, CATCHING_UP, "pending", 0, 0.0, None, False)
            for _, name, _ in moves
        ],
        released=[(cid, h.projector, h.seq) for h in targets],
    )
    await refresh_campaigns(conn, [cid], park=True)
    return Discarded(
        cid,
        seq,
        row.event_type or "",
        max(h.attempt_count for h in targets),
        targets[0].last_error,
        reason,
        [name for _, name, _ in moves],
    )
