"""Holds: what one projector still owes on a campaign while the others go on (S24).

A hold is a row of `projection_holds`, written only when a projector does not apply an event
with the others: it failed on it, it is paused, or (ordered) it has the journal to catch up.
The claim returns each campaign's holds with its rows (`Hold`, read here from the claim's
JSON); the settle writes what a batch leaves of them (`HoldWrite` placed, `HoldKey` released).
This module decides nothing: which projector a hold stops, and when, is the worker's walk
(`outbox.worker.tracks`).

Two shapes:
- an unordered projector's hold is on one event (`seq`), whose work row stays until the
  holder applies it: the row's other projectors have applied it;
- an ordered projector has at most one hold per campaign. Failed or dead, it sits at the
  event that failed (`seq`); pending (paused, or catching up from the journal), at seq 0. It
  stops the projector on the campaign; due again, the projector goes on from its checkpoint
  through the journal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import orjson

from outbox import buckets
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "CATCHING_UP",
    "Hold",
    "HoldKey",
    "HoldWrite",
    "ProjectorHolds",
    "ProjectorStall",
    "RowHold",
    "count_holds",
    "delete_projector_holds",
    "parse_holds",
    "projector_owed",
    "projector_stall",
    "refresh_held_rows",
    "row_holds",
]


class HoldsQueries(Queries):
    list_row_holds: str
    count_holds: str
    refresh_held_rows: str
    delete_projector_holds: str
    get_projector_stall: str
    get_projector_owed: str


Q = HoldsQueries

# The seq of an ordered projector's hold that sits at no event (paused, catching up).
CATCHING_UP = 0

# (campaign_id, projector, seq)
HoldKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Hold:
    """A hold as the claim read it: `due` when it is not dead and its next attempt has come."""

    projector: str
    seq: int
    status: str  # pending | failed | dead
    attempts: int
    next_attempt_at: datetime
    due: bool
    # A worker group's hold (S35, always at seq 0): the event it stands at, the first it owes
    # or the one it failed on; None for the default group's holds.
    from_seq: int | None = None


def parse_holds(text: str | None) -> tuple[Hold, ...]:
    """The claim's JSON of a campaign's (or a row's) holds; () for none."""
    if text is None:
        return ()
    return tuple(
        Hold(
            h["projector"],
            h["seq"],
            h["status"],
            h["attempts"],
            datetime.fromisoformat(h["next"]),
            h["due"],
            h.get("from"),
        )
        for h in orjson.loads(text)
    )


@dataclass(frozen=True, slots=True)
class HoldWrite:
    """A hold a batch places (or keeps): status, attempts, the seconds until it is due again
    (from the settle's instant) and the error. `row`: it stands for its work row's state (the
    row's status, attempts, next attempt and error are worked out from the row's holds);
    `event_type`: the row is made if it is not there (a failure on an event met in the
    journal)."""

    campaign_id: str
    projector: str
    seq: int
    status: str
    attempts: int
    delay: float
    error: str | None
    row: bool
    event_type: str | None = None
    from_seq: int | None = None  # a worker group's hold (S35): the event it stands at

    @property
    def key(self) -> HoldKey:
        return (self.campaign_id, self.projector, self.seq)


@dataclass(frozen=True, slots=True)
class RowHold:
    """A hold on one row, as an operator's tool reads it."""

    projector: str
    seq: int
    status: str
    attempt_count: int
    next_attempt_at: datetime
    last_error: str | None


async def row_holds(conn: Connection, campaign_id: str, seq: int) -> list[RowHold]:
    """The holds of row (campaign_id, seq), by projector (none: its failure is its own)."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    return [RowHold(*r) for r in await conn.fetch(Q.list_row_holds, campaign_id, seq, bucket)]


@dataclass(frozen=True, slots=True)
class ProjectorHolds:
    """One projector's holds (S24): failed, dead, waiting (paused, requeued, catching up), the
    campaigns they hold, and since when the oldest has held."""

    projector: str
    failed: int
    dead: int
    waiting: int
    campaigns: int
    since: datetime
    held_seconds: float
    paused: bool = False  # an operator paused it: its waiting holds are the pause's (S24)


async def count_holds(conn: Connection, campaign_id: str | None = None) -> list[ProjectorHolds]:
    """Holds per projector, one campaign's or all (by projector name)."""
    bucket = await buckets.filter_bucket(conn, campaign_id)
    return [ProjectorHolds(*r) for r in await conn.fetch(Q.count_holds, campaign_id, bucket)]


@dataclass(frozen=True, slots=True)
class ProjectorStall:
    """How far one projector stands from its work (`maintenance health --projector`): the
    events it is dead on and failing on (its holds, and its types' rows failed with no hold);
    the seconds its longest-waiting due hold has gone unworked, and the age of the oldest due
    work row of its types (None: nothing due)."""

    dead: int
    failed: int
    hold_seconds: float | None
    row_seconds: float | None

    @property
    def lag_seconds(self) -> float:
        """The longer of the two waits (0: nothing it owes is due)."""
        return max(self.hold_seconds or 0.0, self.row_seconds or 0.0)


async def projector_stall(
    conn: Connection, projector: str, events: Sequence[str]
) -> ProjectorStall:
    """How long `projector`'s due work has waited, counting the rows of `events` (the types
    it subscribes to)."""
    row = await conn.fetchrow(Q.get_projector_stall, projector, list(events))
    assert row is not None  # scalar subqueries: one row
    return ProjectorStall(row["dead"], row["failed"], row["hold_seconds"], row["row_seconds"])


async def projector_owed(conn: Connection, projector: str, events: Sequence[str]) -> bool:
    """Whether `projector` is owed work now: a hold of it not dead, or a work row of `events`
    (the types it subscribes to), due or not."""
    return bool(await conn.fetchval(Q.get_projector_owed, projector, list(events)))


async def refresh_held_rows(
    conn: Connection, bucket: int, campaigns: Sequence[str], seqs: Sequence[int]
) -> None:
    """The rows (campaigns[i], seqs[i]) of `bucket` that have holds take their status,
    attempts, next attempt and error from them (`outbox_hold_rows`, holds_fn.sql)."""
    await conn.execute(Q.refresh_held_rows, bucket, list(campaigns), list(seqs))


async def delete_projector_holds(conn: Connection, projector: str) -> list[HoldKey]:
    """Every hold of `projector` goes (a retirement); the holds as they were keyed."""
    rows = await conn.fetch(Q.delete_projector_holds, projector)
    return [(r["campaign_id"], r["projector"], r["seq"]) for r in rows]
