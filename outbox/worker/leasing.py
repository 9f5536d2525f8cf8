"""Which rows a batch leases, and for whom (S13, S24).

A row of an event with a lease-mode subscriber is leased by the batch that claims it and runs
after its commit (`outbox.worker.lease`); this module decides which rows: by event type
(`leasing_types`), by who may take each row now (`plan_leases`: its first run for everyone, a
retry for its holders, or neither while a subscriber is away), and by their campaigns'
failures in this batch and their expired leases (`choose_leases`). Pure: no statement runs.
"""

from __future__ import annotations

from collections.abc import Collection

from outbox.errors import LeaseExpired
from outbox.model import Failure, Key
from outbox.projection.registry import Registry
from outbox.queue.claim import ClaimedRow
from outbox.worker.tracks import Tracks

__all__ = ["choose_leases", "leasing_types", "plan_leases"]


def leasing_types(registry: Registry, paused: Collection[str]) -> frozenset[str]:
    """The event types whose rows a batch leases: those with a lease-mode subscriber that is
    not paused (a row leased ends its campaign's walk, S13)."""
    if not paused:
        return registry.leased_types()
    leasing = registry.leased_names() - frozenset(paused)
    return frozenset(
        t
        for t in registry.leased_types()
        if any(p.name in leasing for p in registry.subscribers(t))
    )


def plan_leases(
    registry: Registry, work: list[ClaimedRow], leased_types: frozenset[str], tracks: Tracks
) -> tuple[list[ClaimedRow], dict[Key, frozenset[str]]]:
    """The walked rows of leased types that are leased, and, for a retry, for whom (S13, S24):
    a row whose due holders include a lease-mode projector, for them (its transactional holders
    alone apply it in the batch); a row without holds, for everyone, when every subscriber of
    its event takes it now. Else (a subscriber away or stopped there) its transactional
    projectors apply it in the batch and its lease-mode ones wait in holds, due now, for a
    retry lease."""
    to_lease: list[ClaimedRow] = []
    holders: dict[Key, frozenset[str]] = {}
    leasing = registry.leased_names()
    for row in work:
        if row.event_type not in leased_types:
            continue
        due = tracks.attached.get(row.key)
        if due is not None:
            if due & leasing:
                to_lease.append(row)
                holders[row.key] = due
            continue
        subscribers = registry.subscribers(row.event_type)
        kept = {p.name for p in subscribers if tracks.skips.excludes(p, *row.key)}
        if kept or tracks.holds_row(row.key):
            waiting = [p.name for p in subscribers if p.name in leasing and p.name not in kept]
            tracks.defer(row, waiting)
            continue
        to_lease.append(row)
    return to_lease, holders


def choose_leases(
    rows: list[ClaimedRow], failures: list[Failure], *, max_attempts: int
) -> tuple[list[ClaimedRow], list[tuple[ClaimedRow, LeaseExpired]], int]:
    """Of a batch's rows to lease, those to lease now: not behind a row of their campaign that
    failed in this batch. A row taken back from an expired lease counts that lease as an
    attempt; on its last attempt it comes back apart, with its error, to be recorded dead.
    Returns (to lease, out of attempts, how many were taken back)."""
    failed_at = {f.campaign_id: f.seq for f in failures}
    ready: list[ClaimedRow] = []
    last: list[tuple[ClaimedRow, LeaseExpired]] = []
    reclaimed = 0
    for row in rows:
        if row.seq > failed_at.get(row.campaign_id, row.seq):
            continue
        if row.status == "processing":
            reclaimed += 1
            if row.attempt_count + 1 >= max_attempts:
                expired = LeaseExpired(
                    f"lease expired (owner {row.lease_owner}, epoch {row.claim_epoch}) on the "
                    "last attempt"
                )
                last.append((row, expired))
                continue
        ready.append(row)
    return ready, last, reclaimed
