"""The value types every layer shares: what an append takes and returns, what a projector
sees (one event, or a batch projector's events as columns), what a failed attempt records,
what a batch counts.

Plain dataclasses and names. This module imports nothing from the package and never does I/O,
so any module may use it (errors.py included) without an import circle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast, overload

__all__ = [
    "AppendResult",
    "Background",
    "BatchCounts",
    "DeadPolicy",
    "Event",
    "EventBatch",
    "Failure",
    "Key",
    "Ordering",
    "StoredEvent",
    "Take",
    "Unsubscribed",
    "WorkerMode",
]

Ordering = Literal["campaign", "none"]
DeadPolicy = Literal["block", "park"]
Unsubscribed = Literal["skip", "retry"]
WorkerMode = Literal["apply", "shadow"]
# Which background work a worker does (OUTBOX_BACKGROUND, S25), and which campaigns a claim
# takes: all, those with work rows (`live`), or those that wait for holds alone (`holds`).
Background = Literal["share", "only", "never"]
Take = Literal["all", "live", "holds"]

# A work row, a journal event: (campaign_id, seq).
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Event:
    """An event to append: its type, a JSON payload, optional JSON-object metadata, and the
    version of its payload's schema (1 unless the event's shape changed: docs/projections.md,
    "Events that evolve")."""

    type: str
    payload: Any
    metadata: Mapping[str, Any] | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A journaled event as projectors see it: its payload at `version`, the newest the app's
    upcasters reach from the version it was appended at."""

    campaign_id: str
    seq: int
    type: str
    payload: Any
    metadata: dict[str, Any]
    recorded_at: datetime
    version: int = 1


class EventBatch(Sequence[StoredEvent]):
    """A batch projector's events, as columns: `campaign_ids`, `seqs`, `types`, `payloads`,
    `metadata`, `recorded_at` and `versions` are lists whose i-th items are the i-th event's.

    It is a `Sequence[StoredEvent]` too: indexing or iterating it builds each event's
    `StoredEvent` on first use (once). A projector that reads only the columns it needs builds
    no object per event: `zip(events.campaign_ids, events.payloads)`. Read-only by contract:
    the columns are the worker's, shared with the batch's other projectors.
    """

    __slots__ = (
        "_built",
        "campaign_ids",
        "metadata",
        "payloads",
        "recorded_at",
        "seqs",
        "types",
        "versions",
    )

    def __init__(
        self,
        campaign_ids: list[str],
        seqs: list[int],
        types: list[str],
        payloads: list[Any],
        metadata: list[dict[str, Any]],
        recorded_at: list[datetime],
        versions: list[int] | None = None,
    ) -> None:
        self.campaign_ids = campaign_ids
        self.seqs = seqs
        self.types = types
        self.payloads = payloads
        self.metadata = metadata
        self.recorded_at = recorded_at
        # None: every event is version 1 (the list made once, here)
        self.versions = versions if versions is not None else [1] * len(seqs)
        self._built: list[StoredEvent | None] | None = None

    @classmethod
    def of(cls, events: Iterable[StoredEvent]) -> EventBatch:
        """`events` as a batch (itself when it is one; its objects are kept, not rebuilt)."""
        if isinstance(events, EventBatch):
            return events
        built = list(events)
        batch = cls(
            [e.campaign_id for e in built],
            [e.seq for e in built],
            [e.type for e in built],
            [e.payload for e in built],
            [e.metadata for e in built],
            [e.recorded_at for e in built],
            [e.version for e in built],
        )
        batch._built = list[StoredEvent | None](built)
        return batch

    def take(self, indexes: Sequence[int]) -> EventBatch:
        """The events at `indexes` (in that order), as a batch of their own."""
        if len(indexes) == len(self.seqs) and indexes == range(len(self.seqs)):
            return self
        batch = EventBatch(
            [self.campaign_ids[i] for i in indexes],
            [self.seqs[i] for i in indexes],
            [self.types[i] for i in indexes],
            [self.payloads[i] for i in indexes],
            [self.metadata[i] for i in indexes],
            [self.recorded_at[i] for i in indexes],
            [self.versions[i] for i in indexes],
        )
        if self._built is not None:
            batch._built = [self._built[i] for i in indexes]
        return batch

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, index: int) -> StoredEvent: ...

    @overload
    def __getitem__(self, index: slice) -> EventBatch: ...

    def __getitem__(self, index: int | slice) -> StoredEvent | EventBatch:
        if isinstance(index, slice):
            return self.take(range(len(self.seqs))[index])
        built = self._built
        if built is None:
            built = self._built = [None] * len(self.seqs)
        event = built[index]
        if event is None:
            event = built[index] = StoredEvent(
                self.campaign_ids[index],
                self.seqs[index],
                self.types[index],
                self.payloads[index],
                self.metadata[index],
                self.recorded_at[index],
                self.versions[index],
            )
        return event

    def __iter__(self) -> Iterator[StoredEvent]:
        if self._built is None:  # every event at once, in one pass over the columns
            events = list(
                map(
                    StoredEvent,
                    self.campaign_ids,
                    self.seqs,
                    self.types,
                    self.payloads,
                    self.metadata,
                    self.recorded_at,
                    self.versions,
                )
            )
            self._built = cast(list[StoredEvent | None], events)
            return iter(events)
        return (self[index] for index in range(len(self.seqs)))

    def __repr__(self) -> str:
        return f"<EventBatch of {len(self.seqs)} events>"


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed; `duplicate` is True when an idempotency key replayed it."""

    campaign_id: str
    first_seq: int
    last_seq: int
    duplicate: bool = False

    @property
    def seqs(self) -> range:
        return range(self.first_seq, self.last_seq + 1)


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt of a work row, as the failure policy decided it (`retry`): the
    attempts so far, the delay before the next one, the `last_error` line, and whether the row
    is dead now. `projector` names the projector that raised (None: a guard, a missing event)."""

    campaign_id: str
    seq: int
    attempts: int
    delay: float
    error: str
    dead: bool
    projector: str | None = None


@dataclass
class BatchCounts:
    """What one batch (or a run of them) did to the work rows it claimed."""

    claimed: int = 0
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    dead: int = 0
    observed: int = 0  # shadow mode: rows seen and left for the apply worker
    more_due: int = 0  # campaigns the batch left due now: claim again rather than sleep
    leased: int = 0  # lease mode: rows leased to non-transactional projectors
    reclaimed: int = 0  # ... of which were taken back from an expired lease
    fenced: int = 0  # leases this worker lost before it could end them
    paused: int = 0  # due work left for a paused projector (S24)
    elsewhere: int = 0  # ... for a projector the database knows and this worker lacks (S24)
    behind: int = 0  # rows left while an ordered projector catches their campaign up (due)
    held: int = 0  # events no projector ran: those that owe them are held (S24)

    def add(self, other: BatchCounts) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)
