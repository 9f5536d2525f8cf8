"""Gaps healed from the journal: a group widened with the events an ordered projector lacks.

An ordered projector is behind a campaign when its checkpoint is below the seq before the
campaign's first claimed event (a projector deployed onto campaigns with history, work rows
deleted by hand), or when the claimed seqs skip one. `widen` reads the missing events from the
journal and merges them into the group, marked as the journal's: the checkpoint guard then
hands them to the projectors that lack them, in seq order, and skips them for the others as
duplicates; projectors without a checkpoint never see them. At most `budget` journal events
per group: a campaign that needs more gets the events before its first claimed one up to the
budget, and its claimed events wait for a later batch (`behind`), so a batch's memory and time
stay bounded however much history a new projector has to apply. A seq the journal does not
have is `CheckpointGap`: corruption, the row dead at once.

It never writes, never runs a projector and never moves a checkpoint: `outbox.projection.
dispatch` does, with the widened group.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING

from outbox.append.journal import decode_bulk, load_ranges
from outbox.errors import CheckpointGap
from outbox.model import StoredEvent

if TYPE_CHECKING:
    from outbox import db
    from outbox.db import Connection
    from outbox.projection.guards import CheckpointKey

__all__ = ["HEAL_EVENTS", "Widened", "journal_tail", "widen"]

# Journal events one group may apply to the ordered projectors behind its campaigns.
HEAL_EVENTS = 2000


@dataclass(slots=True)
class Widened:
    """A group with the journal's events merged in: `events`, each with the position of the
    claimed event it is (`origin`, None for the journal's) and the claimed event whose row a
    failure on it is charged to (`charge`); `behind`, the campaigns whose claimed events wait
    (None for those events' positions in `placed`); `gaps`, a claimed event's position and the
    corruption that fails it."""

    events: list[StoredEvent]
    origin: list[int | None]
    charge: list[int]
    placed: list[int | None]
    behind: set[str] = field(default_factory=set)
    gaps: dict[int, CheckpointGap] = field(default_factory=dict)

    @property
    def journal(self) -> set[int]:
        """Positions of the journal's events (for the ordered projectors alone)."""
        return {i for i, o in enumerate(self.origin) if o is None}


def _events(
    rows: Sequence[db.Record],
) -> tuple[dict[str, list[StoredEvent]], dict[str, tuple[int, Exception]]]:
    """Journal rows as events per campaign, up to each campaign's first undecodable one (its
    seq and why)."""
    decoded = decode_bulk(rows)
    journal: dict[str, list[StoredEvent]] = {}
    unavailable: dict[str, tuple[int, Exception]] = {}
    for i, r in enumerate(rows):
        cid = r["campaign_id"]
        if cid in unavailable:
            continue
        if i in decoded.unavailable:
            unavailable[cid] = (r["seq"], decoded.unavailable[i])
            continue
        metadata = decoded.metadata[i]
        assert metadata is not None
        journal.setdefault(cid, []).append(
            StoredEvent(
                cid,
                r["seq"],
                r["event_type"],
                decoded.payloads[i],
                metadata,
                r["recorded_at"],
                r["version"],
            )
        )
    return journal, unavailable


async def journal_tail(
    conn: Connection, starts: dict[str, int], share: int, *, bucket: int | None
) -> tuple[list[StoredEvent], dict[str, tuple[int, Exception]]]:
    """Each campaign's journal events from seq `starts[campaign]` on, at most `share` each, in
    campaign and seq order; and, per campaign, the first one that cannot be decoded (its seq
    and why: the events stop before it)."""
    ranges = [(cid, lo, lo + share - 1) for cid, lo in sorted(starts.items())]
    journal, unavailable = _events(await load_ranges(conn, ranges, bucket=bucket))
    return [e for cid in sorted(journal) for e in journal[cid]], unavailable


def _wanted(seqs: Sequence[int], behind_at: Sequence[int]) -> tuple[int, int] | None:
    """The journal range a campaign's claimed `seqs` need for ordered checkpoints at
    `behind_at`: from the lowest seq some projector lacks to the highest (None: none lacks
    one). A projector lacks the seqs after its checkpoint and before the first claimed one,
    and any seq the claimed ones skip past its checkpoint."""
    first, claimed = seqs[0], set(seqs)
    skipped = [s for s in range(first, seqs[-1]) if s not in claimed]
    lo = hi = None
    for at in behind_at:
        inner = [s for s in skipped if s > at]
        low = at + 1 if at + 1 < first else (inner[0] if inner else None)
        high = inner[-1] if inner else (first - 1 if at + 1 < first else None)
        if low is None or high is None:
            continue
        lo = low if lo is None else min(lo, low)
        hi = high if hi is None else max(hi, high)
    return None if lo is None or hi is None else (lo, hi)


async def widen(
    conn: Connection,
    events: Sequence[StoredEvent],
    ordered: Sequence[str],
    checkpoints: dict[CheckpointKey, int],
    *,
    budget: int | None,
    bucket: int | None,
    stopped: dict[CheckpointKey, int] | None = None,
) -> Widened | None:
    """`events` (sorted by campaign, seq) widened with what the ordered projectors behind
    their campaigns lack (see the module docstring); None when none is behind. `budget`:
    journal events at most (None: no bound; 0: none, every behind campaign waits). A projector
    `stopped` on a campaign (a hold, S24) is not behind it: it gets none of its events."""
    if not ordered or not events:
        return None
    runs: list[tuple[str, int, list[StoredEvent]]] = []
    spans: dict[str, tuple[int, int]] = {}  # campaign -> the journal range it reads
    index = 0
    left = budget
    behind: set[str] = set()
    for campaign_id, same in groupby(events, key=lambda e: e.campaign_id):
        run = list(same)
        runs.append((campaign_id, index, run))
        index += len(run)
        at = [
            checkpoints.get((campaign_id, name), 0)
            for name in ordered
            if not stopped or (campaign_id, name) not in stopped
        ]
        if not at:
            continue
        first_seq, last_seq = run[0].seq, run[-1].seq
        if last_seq - first_seq == len(run) - 1 and min(at) >= first_seq - 1:
            continue  # the usual case: no projector is behind, the claimed seqs adjoin
        wanted = _wanted([e.seq for e in run], at)
        if wanted is None:
            continue
        lo, hi = wanted
        size = hi - lo + 1
        if left is not None and size > left and lo < run[0].seq:
            hi = min(hi, lo + left - 1, run[0].seq - 1)
            behind.add(campaign_id)
        if hi >= lo:
            spans[campaign_id] = lo, hi
            if left is not None:
                left = max(0, left - (hi - lo + 1))
    if not spans and not behind:
        return None
    ranges = [(cid, lo, hi) for cid, (lo, hi) in spans.items()]
    rows = await load_ranges(conn, ranges, bucket=bucket) if ranges else []
    journal, failing = _events(rows)
    unavailable = {cid: exc for cid, (_, exc) in failing.items()}
    wide = Widened([], [], [], [None] * len(events), behind)
    for campaign_id, first, run in runs:
        seqs = [e.seq for e in run]
        claimed = set(seqs)

        def charge(seq: int, first: int = first, seqs: list[int] = seqs) -> int:
            """The claimed event a failure on journal event `seq` is charged to: the next
            claimed one (the first, when none is after it)."""
            k = bisect_right(seqs, seq)
            return first + k if k < len(seqs) else first

        found = [e for e in journal.get(campaign_id, []) if e.seq not in claimed]
        span = spans.get(campaign_id)
        if span is not None:
            lo, hi = span
            have = {e.seq for e in found} | claimed
            missing = next((s for s in range(lo, hi + 1) if s not in have), None)
            if missing is not None or campaign_id in unavailable:
                name = min(ordered, key=lambda n: checkpoints.get((campaign_id, n), 0))
                charged = charge(missing or 0)
                why = (
                    f"the journal lacks seq {missing}"
                    if missing is not None
                    else str(unavailable[campaign_id])
                )
                wide.gaps[charged] = CheckpointGap(
                    f"projector {name!r} is at seq {checkpoints.get((campaign_id, name), 0)} of "
                    f"campaign {campaign_id!r} and cannot apply seq {events[charged].seq}: {why}"
                )
        merged: list[tuple[int, int | None]] = [(e.seq, None) for e in found]
        if campaign_id not in behind:
            merged += [(e.seq, first + k) for k, e in enumerate(run)]
        merged.sort()
        by_seq = {e.seq: e for e in found}
        for seq, origin in merged:
            position = len(wide.events)
            if origin is None:
                wide.events.append(by_seq[seq])
                wide.charge.append(charge(seq))
            else:
                wide.events.append(events[origin])
                wide.charge.append(origin)
                wide.placed[origin] = position
            wide.origin.append(origin)
    return wide
