"""A lease-mode projector's history given again (S31): one step of its replay by the catch-up
engine (`build.py`, kind `replay`), for a projector registered with `replay=True`.

A step takes the next campaigns of a bucket after the replay's resume point, whole, until
they hold `EVENTS` events or more, reads their journals and gives the projector each
campaign's events of its types in seq order, event by event, outside any transaction
(`fn(pool, event)`, `replaying()` true). No checkpoint guards it: a campaign given again after
a kill is given again whole (at least once, the lease's contract). A campaign whose call fails,
or whose journal holds an event that cannot be decoded (up to it), is counted failed.
"""

from __future__ import annotations

from outbox import db
from outbox.append.journal import batch_of, decode_bulk, load_ranges
from outbox.projection.builds import Part, Throttle
from outbox.projection.registry import Projector
from outbox.queries import Queries

__all__ = ["CAMPAIGNS", "EVENTS", "redeliver"]

# Campaigns a step looks at at most, and the events past which it takes no more.
CAMPAIGNS = 500
EVENTS = 5000


class RedeliverQueries(Queries):
    list_replay_campaigns: str


Q = RedeliverQueries


async def redeliver(
    conn: db.Connection,
    pool: db.Pool,
    projector: Projector,
    bucket: int,
    after: str | None,
    throttle: Throttle,
) -> tuple[Part, str] | None:
    """Give `projector` the journals of the next campaigns of `bucket` after `after` (see
    the module docstring): what it gave, and the last campaign taken (None: none left)."""
    heads = await conn.fetch(Q.list_replay_campaigns, bucket, after, CAMPAIGNS)
    ranges, budget = [], EVENTS
    for r in heads:
        head = r["last_seq"] or 0
        ranges.append((r["campaign_id"], 1, head))
        budget -= head
        if budget <= 0:
            break
    if not ranges:
        return None
    rows = await load_ranges(conn, ranges, bucket=bucket, types=projector.events)
    await throttle.take(len(rows))  # the cap counts the projector's events, as the progress
    decoded, cut, keep = decode_bulk(rows), set[str](), list[int]()
    for i, r in enumerate(rows):  # up to an event that cannot be decoded (S8)
        if i in decoded.unavailable or r["campaign_id"] in cut:
            cut.add(r["campaign_id"])
        else:
            keep.append(i)
    batch = batch_of(
        [rows[i] for i in keep],
        [decoded.payloads[i] for i in keep],
        [decoded.metadata[i] for i in keep],
    )
    given: dict[str, list[int]] = {c: [] for c, _, _ in ranges}
    for j, cid in enumerate(batch.campaign_ids):
        given[cid].append(j)
    got = Part()
    for campaign, indexes in given.items():
        try:
            await projector.run(pool, batch.take(indexes), replaying=True)  # type: ignore[arg-type]
        except Exception:
            got.failed += 1
            continue
        got.events += len(indexes)
        got.campaigns += campaign not in cut
        got.failed += campaign in cut
    return got, ranges[-1][0]
