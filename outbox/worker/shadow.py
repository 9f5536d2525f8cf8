"""The shadow worker: claims and loads like the apply worker, applies nothing.

Under the shadow flag a fleet proves the queue before it applies anything: every due row is
claimed (in any order), sighted (a count, first and last seen) and looked at again a poll
interval later. It never consumes an attempt and never makes a row dead; rows whose event
already counts as applied are completed, so the queue stays bounded.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from outbox.model import BatchCounts
from outbox.projection.guards import applied_events
from outbox.queue.claim import ClaimedCampaign
from outbox.queue.settle import record_observations, settle
from outbox.worker.batch import AfterCommit, Worker

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["ShadowWorker"]


class ShadowWorker(Worker):
    """The shadow worker: claims due rows like the apply worker and loads their events,
    but runs no projector. It records a sighting (count, first and last seen) and looks again a
    poll interval later; it never consumes an attempt and never makes a row dead. Rows whose
    event already counts as applied (inline, checkpoint, marker, or an ignored type) are
    completed, so the queue stays bounded."""

    def _claim_ordered(self) -> bool:
        return False  # every due row, in any order: nothing is applied

    async def _handle(
        self,
        conn: Connection,
        campaigns: list[ClaimedCampaign],
        now: datetime | None,
        after: AfterCommit,
        *,
        careful: bool = False,
    ) -> BatchCounts:
        # The campaign rows are left as they are: earlier than the truth, which the apply
        # worker's next claim of them corrects.
        rows = [r for c in campaigns for r in c.rows]
        events = [(r.campaign_id, r.seq, r.event_type) for r in rows if r.event_type is not None]
        done = await applied_events(
            conn, self.app.registry, events, unsubscribed=self.app.settings.unsubscribed
        )
        seen = [r.key for r in rows if r.key not in done]
        await settle(conn, done=sorted(done))
        await record_observations(
            conn, seen, look_again_in=self.app.settings.poll_interval, now=now
        )
        return BatchCounts(claimed=len(rows), skipped=len(done), observed=len(seen))
