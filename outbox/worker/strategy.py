"""What a batch does with what it claimed: the strategy a `Worker` runs, and what it hands on.

A `Worker` owns the batch's transaction (the bucket, the claim, the commit, what runs after
it); its `Strategy` decides what the claimed campaigns become inside that transaction. The
apply worker's is `apply.Apply` (projectors under the guards, failures isolated, leases,
settle); the shadow worker's is `shadow.Shadow` (sightings only). A strategy sees the batch
through `Batch` and reports through its counts and `AfterCommit`; it never commits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from outbox.config import Settings
from outbox.model import BatchCounts
from outbox.projection.app import Outbox
from outbox.projection.registry import Registry
from outbox.queue.claim import ClaimedCampaign
from outbox.queue.lease import Lease
from outbox.retry import FailurePolicy

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["AfterCommit", "Batch", "Isolate", "Strategy"]


@dataclass
class AfterCommit:
    """What a batch hands on past its commit: leases to run, figures for the metrics (events
    per projector and outcome, each projector call's seconds, each completed row's seconds
    since it was enqueued)."""

    leases: list[Lease] = field(default_factory=list)
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[tuple[str, float]] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)
    unsubscribed: Counter[str] = field(default_factory=Counter)  # completed unapplied, per type
    # The projectors in force when the batch ran (S29): its leases end with them.
    registry: Registry | None = None
    # Whether its claim took all it could (an ordered claim that met its campaign limit did
    # not): the batch's own, whatever the worker's other loops claimed meanwhile.
    took_all: bool = True


class Isolate(Exception):
    """A batch applied without savepoints met a failing event: roll it back and run it again
    with a savepoint per group, which isolates the event."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch as its strategy sees it: the app and the failure policy, the worker's id (the
    owner of its leases), the transaction's connection, the bucket it claimed in, the instant
    tests move (None: the database clock), what it hands on past the commit, whether each
    group runs in a savepoint of its own (`careful`, after a failure), and whether it takes
    background work (`background`: campaigns that wait for holds alone, catch-ups; S25); the
    projectors in force (`registry`: the app's, less the versions superseded, S29)."""

    app: Outbox
    registry: Registry
    policy: FailurePolicy
    worker_id: str
    conn: Connection
    bucket: int
    now: datetime | None
    after: AfterCommit
    careful: bool
    background: bool = True


class Strategy(Protocol):
    """What a worker does with what it claims."""

    def claims_in_order(self, settings: Settings) -> bool:
        """Whether the claim goes by campaign (the queue's campaign rows) or by row."""
        ...

    async def handle(self, batch: Batch, campaigns: list[ClaimedCampaign]) -> BatchCounts:
        """Do the batch's work in its transaction (never commit); raise `Isolate` to have it
        run again with a savepoint per group."""
        ...
