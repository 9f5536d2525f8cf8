"""The batch walk: what a claimed batch takes from its campaigns, and what it leaves in the
campaign queue.

`walk()` chooses the rows a batch processes from the campaigns a claim holds (per campaign in
seq order, stopping where ordering says so): a pure function. `campaign_writes()` turns what
the batch saw and did into each campaign row's new state for the settle
(`outbox.queue.settle`). Neither applies anything nor writes work rows; only `campaign_writes`
runs statements, and only for campaign rows found behind the truth (a refresh under the
append-head lock): a batch's happy path runs none here.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from outbox.model import Failure, Key
from outbox.queue.claim import ClaimedCampaign, ClaimedRow
from outbox.queue.settle import CampaignWrite, refresh_campaigns
from outbox.worker.tracks import Tracks

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["campaign_writes", "walk"]


def walk(
    campaigns: list[ClaimedCampaign],
    *,
    limit: int,
    park: bool,
    ordered: bool = True,
    stop_after: frozenset[str] = frozenset(),
    attached: dict[Key, frozenset[str]] | None = None,
    leasing: frozenset[str] = frozenset(),
) -> list[ClaimedRow]:
    """The rows to process, per campaign in seq order, at most `limit` in all. Under campaign
    ordering a campaign stops at its first row that is not due (a dead row is stepped over
    under `park`), and under `block` a campaign with any row before its head waits. A row with
    holds (`attached`: its due holders, S24) is taken when one is due and stepped over when
    none is: it stops no campaign. A row of an event type in `stop_after` (leased: applied
    after the batch) is its campaign's last, as is a row with holds whose due holders include
    one of `leasing` (lease-mode projectors: a retry's lease)."""
    attached = attached or {}
    chosen: list[ClaimedRow] = []
    for campaign in campaigns:
        rows = campaign.rows
        first = campaign.first_seq  # None: no row but dead ones that stand for dead holds
        if ordered and not park and rows and first is not None and first < rows[0].seq:
            continue  # a dead row, or a campaign row behind the truth: see campaign_writes
        for row in rows:
            if len(chosen) >= limit:
                return chosen
            holders = attached.get(row.key)
            if holders is not None:
                if holders:
                    chosen.append(row)
                    if ordered and holders & leasing:
                        break  # a retry's lease: the campaign waits behind it
                continue
            if not row.due:
                if ordered and not (park and row.status == "dead"):
                    break
                continue
            chosen.append(row)
            if ordered and row.event_type in stop_after:
                break
    return chosen


async def campaign_writes(
    conn: Connection,
    campaigns: list[ClaimedCampaign],
    done: set[Key],
    failures: list[Failure],
    *,
    park: bool,
    leased: dict[Key, datetime] | None = None,
    tracks: Tracks | None = None,
) -> list[CampaignWrite]:
    """What each held campaign's row becomes, from what the batch saw and did: its first
    remaining row (live, or held for a projector that will try again, S24) is the new head,
    and its due time the earliest of its first live row without holds and its holds' next
    attempts (blocked under `block` when a row's own dead row precedes that row); past the rows
    it saw, the next row is due now. A campaign left with nothing live and no hold but dead
    ones (an operator's to requeue or discard) is marked `gone`: the settle
    deletes it under its append head's lock; one whose head lies before what the claim read
    (a campaign row behind the truth) is read back from the work rows here. A head the batch
    leased is due when its lease expires (`leased`). Only for ordering `campaign`: under
    `none` the claim reads the work rows directly."""
    leased = leased or {}
    failed = {(f.campaign_id, f.seq): f for f in failures}
    writes: list[CampaignWrite] = []
    unknown: list[str] = []
    for campaign in campaigns:
        cid, rows = campaign.campaign_id, campaign.rows
        if campaign.first_seq is not None and (
            not rows or (not park and campaign.first_seq < rows[0].seq)
        ):
            unknown.append(cid)
            continue
        kept, placed = tracks.left(cid) if tracks is not None else ([], [])
        tracked = tracks is not None and not tracks.quiet
        dead_before = False
        head: ClaimedRow | None = None
        driver: ClaimedRow | None = None  # the first live row without holds
        for row in rows:
            if row.key in done:
                continue
            if tracked and tracks is not None and tracks.holds_row(row.key):
                if tracks.row_waits(row.key):  # a holder will try again: the claim reads it
                    head = head or row
                continue  # every holder is dead on it: an operator's, out of the claim's way
            failure = failed.get(row.key)
            if failure.dead if failure else row.status == "dead":
                dead_before = True
                continue
            head = head or row
            driver = row
            break
        blocked = dead_before and not park
        due_at = min((h.next_attempt_at for h in kept if h.status != "dead"), default=None)
        delay = min((w.delay for w in placed if w.status != "dead"), default=None)
        if driver is not None:
            if driver.key in failed:
                wait = failed[driver.key].delay
                delay = wait if delay is None else min(delay, wait)
            else:
                at = leased.get(driver.key, driver.next_attempt_at)
                due_at = at if due_at is None else min(due_at, at)
        more = bool(rows) and campaign.last_seq is not None and campaign.last_seq > rows[-1].seq
        if driver is None and more:
            delay = 0.0
        after = rows[-1].seq + 1 if rows else 0
        waiting = (
            head is not None
            or any(h.status != "dead" for h in kept)
            or any(w.status != "dead" for w in placed)
        )
        if not waiting and not more:  # nothing live: deleted by the settle if it holds the
            # append head and nothing at or past the first seq not seen exists by then
            writes.append(CampaignWrite(cid, after, None, blocked, gone=True))
            continue
        seen = None
        if driver is None and not more:  # waits for holds alone: a row appended meanwhile
            seen = max(campaign.last_seq or 0, rows[-1].seq if rows else 0)  # must not
        writes.append(
            CampaignWrite(
                cid,
                head.seq if head is not None else after,
                due_at,
                blocked,
                delay=delay,
                seen=seen,
            )
        )
    await refresh_campaigns(conn, unknown, park=park)  # it holds their append heads itself
    return writes
