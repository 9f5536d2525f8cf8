"""The shadow worker's strategy: claims and loads like the apply worker, applies nothing.

Under the shadow flag a fleet proves the queue before it applies anything: every due row is
claimed (in any order), sighted (a count, first and last seen) and looked at again a poll
interval later. It never consumes an attempt and never makes a row dead; rows whose event
already counts as applied are completed, so the queue stays bounded. A shadow worker is a
`Worker` whose strategy is `Shadow()`.
"""

from __future__ import annotations

from outbox.config import Settings
from outbox.model import BatchCounts
from outbox.projection.guards import applied_events
from outbox.queue.claim import ClaimedCampaign
from outbox.queue.settle import record_observations, settle
from outbox.worker.strategy import Batch

__all__ = ["Shadow"]


class Shadow:
    """The shadow worker's strategy: it runs no projector. It records a sighting of each
    claimed row (count, first and last seen) and looks again a poll interval later; rows whose
    event already counts as applied (inline, checkpoint, marker, or an ignored type) are
    completed."""

    def claims_in_order(self, settings: Settings) -> bool:
        return False  # every due row, in any order: nothing is applied

    async def handle(self, batch: Batch, campaigns: list[ClaimedCampaign]) -> BatchCounts:
        # The campaign rows are left as they are: earlier than the truth, which the apply
        # worker's next claim of them corrects.
        settings, conn, bucket = batch.app.settings, batch.conn, batch.bucket
        rows = [r for c in campaigns for r in c.rows]
        events = [(r.campaign_id, r.seq, r.event_type) for r in rows if r.event_type is not None]
        done = await applied_events(
            conn, batch.registry, events, unsubscribed=settings.unsubscribed, bucket=bucket
        )
        seen = [r.key for r in rows if r.key not in done]
        await settle(conn, bucket=bucket, done=sorted(done))
        await record_observations(
            conn, seen, look_again_in=settings.poll_interval, now=batch.now, bucket=bucket
        )
        return BatchCounts(claimed=len(rows), skipped=len(done), observed=len(seen))
