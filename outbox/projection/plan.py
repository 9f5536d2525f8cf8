"""Which projector gets which events of a group: the ordered checkpoints' verdicts and each
subscriber's share (pure; `outbox.projection.dispatch` runs them).

A group is a sequence of events sorted by campaign and seq, addressed by position. It never
touches the database and never runs a projector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING

from outbox.errors import CheckpointGap

if TYPE_CHECKING:
    from outbox.projection.guards import CheckpointKey
    from outbox.projection.registry import Projector

__all__ = ["Run", "pass_checkpoints", "plan_runs"]


@dataclass(slots=True)
class Run:
    """A projector's share of a group: how many of its events it subscribes to, and the
    positions of those its guards let through (in order)."""

    projector: Projector
    subscribed: int
    indexes: Sequence[int]


def plan_runs(
    types: list[str],
    kinds: dict[str, tuple[Projector, ...]],
    duplicates: dict[str, set[int]],
    journal: frozenset[int],
) -> list[Run]:
    """Every transactional subscriber of the group's types, by name, with its events' positions
    less its duplicates (lease-mode projectors run outside the transaction, S13). Positions in
    `journal` (events merged in from the journal) are an ordered projector's alone, and count
    in no projector's `subscribed`."""
    projectors = {p.name: p for subs in kinds.values() for p in subs if p.transactional}
    plan: list[Run] = []
    for name in sorted(projectors):
        p = projectors[name]
        indexes: Sequence[int] = (
            range(len(types))
            if all(t in p.events for t in kinds)
            else [i for i, t in enumerate(types) if t in p.events]
        )
        subscribed = len(indexes)
        if journal:
            if not p.ordered:
                indexes = [i for i in indexes if i not in journal]
            subscribed = sum(1 for i in indexes if i not in journal)
        if held := duplicates.get(name):
            indexes = [i for i in indexes if i not in held]
        plan.append(Run(p, subscribed, indexes))
    return plan


def pass_checkpoints(
    campaign_ids: Sequence[str],
    seqs: Sequence[int],
    ordered: Sequence[str],
    checkpoints: dict[CheckpointKey, int],
) -> tuple[dict[str, set[int]], tuple[int, CheckpointGap] | None]:
    """Move every `ordered` projector's checkpoint past each campaign's events of the group
    (sorted by campaign, seq), in place (S17: every ordered checkpoint passes every event);
    return each projector's duplicates (positions at or before its checkpoint) and the first
    gap with its position (none once `outbox.projection.heal` has widened the group)."""
    duplicates: dict[str, set[int]] = {}
    if not ordered:
        return duplicates, None
    end = 0
    for campaign_id, same in groupby(campaign_ids):  # each campaign's run of events
        start, end = end, end + len(list(same))
        first, last = seqs[start], seqs[end - 1]
        gap: tuple[int, CheckpointGap] | None = None
        for name in ordered:
            key = (campaign_id, name)
            at = checkpoints.get(key, 0)
            if first == at + 1 and last - first == end - start - 1:
                checkpoints[key] = last  # the seqs right after the checkpoint
                continue
            for index in range(start, end if gap is None else gap[0]):
                seq = seqs[index]
                if seq <= at:
                    duplicates.setdefault(name, set()).add(index)
                elif seq == at + 1:
                    at = seq
                else:
                    gap = (
                        index,
                        CheckpointGap(
                            f"projector {name!r} is at seq {at} of campaign {campaign_id!r} "
                            f"and cannot apply seq {seq}"
                        ),
                    )
                    break
            checkpoints[key] = at
        if gap is not None:
            return duplicates, gap
    return duplicates, None
