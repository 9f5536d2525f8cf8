"""The exactly-once guards, and dispatch of a group of events to the registered projectors.

`Dispatch` serves one batch (or one inline append, or one replay) on the caller's connection,
inside the caller's transaction. `load()` locks the checkpoints of the batch's campaigns in one
statement (or `use()` takes those an ordered claim locked). `apply(events)` runs a group of
events (the caller brackets it with `open_group()` and, on failure, `undo_group()`): it derives
every ordered projector's verdict (apply / duplicate / gap) from those checkpoints and the
seqs, reserves the processed markers of every idempotent projector in one statement, runs
per-event projectors event by event and batch projectors once with their events. `moves()`
says where the checkpoints moved, for the caller's settle (`outbox.queue.settle`, the one
statement that writes them). The happy path pays no per-event round trip of the library's own.

A failure is raised as `GroupFailed`, carrying the index of the event it belongs to when that is
known (a per-event projector, a gap, an unknown type), so the caller can isolate it. This module
never claims, deletes or retries work rows, and never opens a transaction of its own. It owns
every other statement on `projection_checkpoints` and `processed_markers` (locks, creation,
reads, a rebuild's marker reset, pruning).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import CheckpointGap, UnknownEventType
from outbox.model import Key, StoredEvent, Unsubscribed
from outbox.obs import log
from outbox.projection.registry import Projector, Registry
from outbox.queries import Queries
from outbox.queue.settle import settle
from outbox.retry import describe_error

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "ApplyOutcome",
    "Dispatch",
    "GroupFailed",
    "applied_events",
    "apply_event",
    "delete_markers",
    "prune_markers",
    "reserve_markers",
]


class GuardsQueries(Queries):
    lock_checkpoints: str
    create_checkpoints: str
    open_group: str
    undo_group: str
    reserve_markers: str
    list_checkpoints: str
    list_markers: str
    delete_markers: str
    prune_markers: str


Q = GuardsQueries

_logger = log.get_logger("outbox.worker")
# Event types this process completed unsubscribed and said so (once per type).
_announced: set[str] = set()


def _announce(event_type: str) -> None:
    if event_type not in _announced:
        _announced.add(event_type)
        _logger.info(
            "apply.unsubscribed",
            extra={
                "event_type": event_type,
                "hint": "no projector subscribes: its events complete unapplied "
                "(OUTBOX_UNSUBSCRIBED=skip); a projector added later rebuilds from the journal",
            },
        )


class ApplyOutcome(enum.Enum):
    APPLIED = "applied"  # at least one projector ran
    DUPLICATE = "duplicate"  # every subscribed projector had already applied it
    IGNORED = "ignored"  # the app declared the type as needing no projection
    UNSUBSCRIBED = "unsubscribed"  # no projector subscribes, and OUTBOX_UNSUBSCRIBED=skip


class GroupFailed(Exception):
    """A group of events failed; `index` is the failing event's position when known, and
    `projector` the name of the projector that raised (None: a guard or the dispatch)."""

    def __init__(
        self, cause: BaseException, index: int | None, projector: str | None = None
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.index = index
        self.projector = projector

    def describe(self) -> str:
        """The `last_error` line: the projector's name, the error's type and message."""
        return describe_error(self.cause, projector=self.projector)


CheckpointKey = tuple[str, str]  # (campaign_id, projector)


@dataclass
class Dispatch:
    """Guards and dispatch for one batch on `conn` (see the module docstring)."""

    conn: Connection
    registry: Registry
    # What happens to an event no projector subscribes to (OUTBOX_UNSUBSCRIBED): `skip`
    # completes it, `retry` fails it (UnknownEventType) until a projector for it is deployed.
    unsubscribed: Unsubscribed = "skip"
    checkpoints: dict[CheckpointKey, int] = field(default_factory=dict)
    moved: set[CheckpointKey] = field(default_factory=set)
    # For metrics: events per (projector, outcome) of the groups that applied ("applied", or
    # "skipped" by the projector's guard) plus each failure ("failed"), and every call's time.
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[tuple[str, float]] = field(default_factory=list)
    # Events completed unsubscribed, per type (for the metric).
    skipped_types: Counter[str] = field(default_factory=Counter)

    async def load(self, campaigns: Sequence[str], *, held: bool = False) -> None:
        """Lock and read the ordered projectors' checkpoints of `campaigns` (one statement).

        `held`: the caller holds the campaigns against every other applier (an append's head,
        a campaign row), so a missing checkpoint reads as 0. Otherwise missing rows are
        created first and locked, so two concurrent applications of a campaign's first events
        cannot both read "missing" and apply them twice (two more statements, only then)."""
        ordered = self.registry.ordered_names()
        if not ordered or not campaigns:
            return
        keys = sorted(set(campaigns))
        rows = await self.conn.fetch(Q.lock_checkpoints, keys, ordered)
        if not held and len(rows) < len(keys) * len(ordered):
            await self.conn.execute(Q.create_checkpoints, keys, ordered)
            rows = await self.conn.fetch(Q.lock_checkpoints, keys, ordered)
        for r in rows:
            self.checkpoints[(r["campaign_id"], r["projector"])] = r["applied_seq"]

    def use(self, checkpoints: dict[CheckpointKey, int]) -> None:
        """Take checkpoints the caller already locked (an ordered claim reads them)."""
        self.checkpoints.update(checkpoints)

    async def open_group(self) -> None:
        await self.conn.execute(Q.open_group)

    async def undo_group(self) -> None:
        await self.conn.execute(Q.undo_group)

    async def apply(self, events: Sequence[StoredEvent]) -> list[ApplyOutcome]:
        """Apply `events` (sorted by campaign_id, seq) once each; call inside a savepoint.
        Raises GroupFailed; on success the checkpoints move (in memory until `settle`)."""
        registry = self.registry
        ordered = registry.ordered_names()
        checkpoints = dict(self.checkpoints)
        runs: list[list[Projector]] = []  # the projectors to run, per event
        outcomes: list[ApplyOutcome] = []
        for index, event in enumerate(events):
            subscribed = registry.subscribers(event.type)
            unsubscribed = not subscribed and event.type not in registry.ignored
            if unsubscribed and self.unsubscribed == "retry":
                raise GroupFailed(
                    UnknownEventType(f"no projector subscribes to event type {event.type!r}"),
                    index,
                )
            duplicate: set[str] = set()
            for name in ordered:  # every ordered checkpoint passes every event (S17)
                key = (event.campaign_id, name)
                at = checkpoints.get(key, 0)
                if event.seq <= at:
                    duplicate.add(name)
                elif event.seq == at + 1:
                    checkpoints[key] = event.seq
                else:
                    raise GroupFailed(
                        CheckpointGap(
                            f"projector {name!r} is at seq {at} of campaign "
                            f"{event.campaign_id!r} and cannot apply seq {event.seq}"
                        ),
                        index,
                    )
            # Non-transactional projectors run under a lease, outside this transaction (S13).
            runs.append([p for p in subscribed if p.transactional and p.name not in duplicate])
            outcomes.append(
                ApplyOutcome.APPLIED
                if subscribed
                else ApplyOutcome.UNSUBSCRIBED
                if unsubscribed
                else ApplyOutcome.IGNORED
            )
        await self._reserve_markers(events, runs)
        try:
            await self._run(events, runs)
        except GroupFailed as failed:
            if failed.projector is not None:
                self.tally[(failed.projector, "failed")] += 1
            raise
        tally = self.tally
        for index, (event, run) in enumerate(zip(events, runs, strict=True)):
            if outcomes[index] is ApplyOutcome.UNSUBSCRIBED:
                self.skipped_types[event.type] += 1
                _announce(event.type)
            if not run and outcomes[index] is ApplyOutcome.APPLIED:
                outcomes[index] = ApplyOutcome.DUPLICATE
            for p in registry.subscribers(event.type):
                if p.transactional:
                    tally[(p.name, "applied" if p in run else "skipped")] += 1
        self.moved |= {k for k, v in checkpoints.items() if self.checkpoints.get(k) != v}
        self.checkpoints = checkpoints
        return outcomes

    async def _reserve_markers(
        self, events: Sequence[StoredEvent], runs: list[list[Projector]]
    ) -> None:
        """One statement for the group; a projector whose marker exists drops out of the run."""
        wanted = [
            (e.campaign_id, e.seq, p.name)
            for e, run in zip(events, runs, strict=True)
            for p in run
            if p.idempotent and not p.ordered
        ]
        if not wanted:
            return
        reserved = await reserve_markers(self.conn, wanted)
        for e, run in zip(events, runs, strict=True):
            run[:] = [
                p
                for p in run
                if not (p.idempotent and not p.ordered)
                or (e.campaign_id, e.seq, p.name) in reserved
            ]

    async def _run(self, events: Sequence[StoredEvent], runs: list[list[Projector]]) -> None:
        """Per-event projectors event by event, then each batch projector once."""
        batches: dict[str, tuple[Projector, list[int]]] = {}
        for index, (event, run) in enumerate(zip(events, runs, strict=True)):
            for projector in run:
                if projector.batch:
                    batches.setdefault(projector.name, (projector, []))[1].append(index)
                    continue
                started = perf_counter()
                try:
                    await projector.run(self.conn, [event])
                except Exception as exc:
                    raise GroupFailed(exc, index, projector.name) from exc
                finally:
                    self.durations.append((projector.name, perf_counter() - started))
        for projector, indexes in batches.values():
            started = perf_counter()
            try:
                await projector.run(self.conn, [events[i] for i in indexes])
            except Exception as exc:
                # Which event failed is known only when the projector had just one.
                at = indexes[0] if len(indexes) == 1 else None
                raise GroupFailed(exc, at, projector.name) from exc
            finally:
                self.durations.append((projector.name, perf_counter() - started))

    def moves(self) -> list[tuple[str, str, int]]:
        """(campaign_id, projector, applied_seq) of every checkpoint that moved, sorted (a
        fixed lock order); the caller writes them with its settle."""
        moved = [(k[0], k[1], self.checkpoints[k]) for k in sorted(self.moved)]
        self.moved.clear()
        return moved


async def apply_event(
    conn: Connection,
    registry: Registry,
    event: StoredEvent,
    *,
    unsubscribed: Unsubscribed = "skip",
) -> ApplyOutcome:
    """Apply one event with its guards and move the checkpoints (inside a transaction); raise
    what failed. For callers that hold a single event: tests, tools."""
    dispatch = Dispatch(conn, registry, unsubscribed)
    await dispatch.load([event.campaign_id])
    try:
        (outcome,) = await dispatch.apply([event])
    except GroupFailed as failed:
        raise failed.cause from None
    await settle(conn, checkpoints=dispatch.moves())
    return outcome


async def applied_events(
    conn: Connection,
    registry: Registry,
    events: Sequence[tuple[str, int, str]],
    *,
    unsubscribed: Unsubscribed = "retry",
) -> set[Key]:
    """Which of `(campaign_id, seq, type)` count as applied: the type is declared ignored (or
    no projector subscribes to it, under `unsubscribed="skip"`), or every projector subscribed
    to it applied the event (checkpoint at or past its seq, or its processed marker).
    Unguarded projectors cannot tell, so their events never count as applied."""
    if not events:
        return set()
    checkpoints = {
        (r["campaign_id"], r["projector"]): r["applied_seq"]
        for r in await conn.fetch(Q.list_checkpoints, sorted({e[0] for e in events}))
    }
    markers = {
        (r["campaign_id"], r["seq"], r["handler"])
        for r in await conn.fetch(Q.list_markers, [e[0] for e in events], [e[1] for e in events])
    }
    applied = set()
    for campaign_id, seq, event_type in events:
        subscribed = registry.subscribers(event_type)
        if not subscribed:
            if event_type in registry.ignored or unsubscribed == "skip":
                applied.add((campaign_id, seq))
            continue
        if all(
            checkpoints.get((campaign_id, p.name), 0) >= seq
            if p.ordered
            else p.idempotent and (campaign_id, seq, p.name) in markers
            for p in subscribed
        ):
            applied.add((campaign_id, seq))
    return applied


async def reserve_markers(
    conn: Connection, wanted: Sequence[tuple[str, int, str]]
) -> set[tuple[str, int, str]]:
    """Reserve the processed markers (campaign_id, seq, handler) in one statement; returns the
    ones reserved now (the others were applied before)."""
    rows = await conn.fetch(
        Q.reserve_markers,
        [w[0] for w in wanted],
        [w[1] for w in wanted],
        [w[2] for w in wanted],
    )
    return {(r["campaign_id"], r["seq"], r["handler"]) for r in rows}


async def delete_markers(conn: Connection, campaign_id: str, projector: str) -> None:
    """Forget what an idempotent projector applied in a campaign (a rebuild starts over)."""
    await conn.execute(Q.delete_markers, campaign_id, projector)


async def prune_markers(conn: Connection, *, retention_hours: int, batch_size: int) -> int:
    """Delete markers older than `retention_hours`, `batch_size` per statement; how many."""
    return await db.prune(conn, Q.prune_markers, retention_hours, batch_size)
