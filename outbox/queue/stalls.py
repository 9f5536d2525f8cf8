"""Stalled campaigns (S33): a campaign whose head row has been due for a while, that nothing
holds and nothing blocks, and that the claim cannot take (its campaign row missing, or not due).

No rule of the queue leaves a campaign so: a row written around the append (by hand, by a
tool, a restore), or a fault not found yet, does. The report, the console and the default
`maintenance health` name such campaigns, so that "oldest claimable: none" is never all an
operator sees while work waits; `maintenance reconcile` gives a campaign without its row one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["STALL_AFTER", "StalledCampaign", "stalled_campaigns"]

# Seconds a head stays due before its campaign counts as stalled (`maintenance health
# --max-stall`): many poll intervals, so a claim that is merely busy never trips it.
STALL_AFTER = 60.0


class StallsQueries(Queries):
    list_stalled_campaigns: str


Q = StallsQueries


@dataclass(frozen=True, slots=True)
class StalledCampaign:
    """A stalled campaign: its head (seq, status), how long the head has been due, and its
    campaign row's due time (None: it has none)."""

    campaign_id: str
    seq: int
    status: str
    due_seconds: float
    campaign_due_at: datetime | None

    def describe(self) -> str:
        why = (
            "it has no campaign row (maintenance reconcile gives it one)"
            if self.campaign_due_at is None
            else f"its campaign row is not due until {self.campaign_due_at.isoformat()}"
        )
        return (
            f"campaign {self.campaign_id!r} is stalled: seq {self.seq} ({self.status}) has been "
            f"due for {self.due_seconds:.0f}s and no claim can take it: {why}"
        )


async def stalled_campaigns(
    conn: Connection, *, after: float = STALL_AFTER, limit: int = 100, ordered: bool = True
) -> list[StalledCampaign]:
    """Up to `limit` campaigns stalled for over `after` seconds, longest first (none under
    ordering `none`: the claim reads the rows themselves)."""
    if not ordered:
        return []
    rows = await conn.fetch(Q.list_stalled_campaigns, after, limit)
    return [StalledCampaign(*r) for r in rows]
