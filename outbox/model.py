"""The value types every layer shares: what an append takes and returns, what a projector
sees, what a failed attempt records, what a batch counts.

Plain dataclasses and names. This module imports nothing from the package and never does I/O,
so any module may use it (errors.py included) without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "AppendResult",
    "BatchCounts",
    "DeadPolicy",
    "Event",
    "Failure",
    "Key",
    "Ordering",
    "StoredEvent",
    "Unsubscribed",
    "WorkerMode",
]

Ordering = Literal["campaign", "none"]
DeadPolicy = Literal["block", "park"]
Unsubscribed = Literal["skip", "retry"]
WorkerMode = Literal["apply", "shadow"]

# A work row, a journal event: (campaign_id, seq).
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Event:
    """An event to append: its type, a JSON payload, optional JSON-object metadata."""

    type: str
    payload: Any
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A journaled event as projectors see it."""

    campaign_id: str
    seq: int
    type: str
    payload: Any
    metadata: dict[str, Any]
    recorded_at: datetime


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

    def add(self, other: BatchCounts) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)
