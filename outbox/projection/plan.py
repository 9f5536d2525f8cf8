"""Which projector gets which events of a group: the ordered checkpoints' verdicts, each
subscriber's share, and what the holds keep from it (`Skips`, S24) (pure;
`outbox.projection.dispatch` runs them).

A group is a sequence of events sorted by campaign and seq, addressed by position. It never
touches the database and never runs a projector.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING

from outbox.errors import CheckpointGap
from outbox.model import EventBatch, Key

if TYPE_CHECKING:
    from outbox.projection.guards import CheckpointKey
    from outbox.projection.registry import Projector, Registry

__all__ = [
    "Run",
    "Skips",
    "first_unknown",
    "pass_checkpoints",
    "plan_runs",
    "starting_now",
]


@dataclass(slots=True)
class Skips:
    """What a group's holds keep from its projectors (S24): an ordered projector `stopped` on a
    campaign from a seq on (a hold: failed, dead, paused); events `held` from one projector (an
    unordered projector's hold); rows whose other projectors applied them before (`only`:
    their holders run them, and projectors with a guard, which skips what they applied; a
    projector without one never runs such a row again); unordered projectors that take a
    campaign's events from the journal (`catching`: a catch-up, S25)."""

    stopped: dict[CheckpointKey, int] = field(default_factory=dict)
    held: set[tuple[str, int, str]] = field(default_factory=set)
    only: dict[Key, frozenset[str]] = field(default_factory=dict)
    catching: set[CheckpointKey] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.stopped or self.held or self.only or self.catching)

    @classmethod
    def catching_up(
        cls,
        registry: Registry,
        tails: Mapping[str, Collection[str]],
        held: Collection[tuple[str, int, str]],
    ) -> Skips:
        """A catch-up's: each campaign's journal events to its projectors in `tails` alone (the
        other ordered ones stopped, the unordered ones in `tails` catching up), less the events
        `held` from one."""
        return cls(
            {
                (cid, name): 0
                for cid, names in tails.items()
                for name in registry.ordered_names()
                if name not in names
            },
            set(held),
            catching={
                (cid, name)
                for cid, names in tails.items()
                for name in names
                if not registry.projectors[name].ordered
            },
        )

    def stop(self, campaign_id: str, projector: str, seq: int) -> None:
        key = (campaign_id, projector)
        self.stopped[key] = min(seq, self.stopped.get(key, seq))

    def positions(
        self, types: list[str], kinds: dict[str, tuple[Projector, ...]], group: EventBatch
    ) -> frozenset[int]:
        """The positions of `group` an event some transactional subscriber is kept from."""
        cids, seqs = group.campaign_ids, group.seqs
        return frozenset(
            i
            for i, t in enumerate(types)
            if any(self.excludes(p, cids[i], seqs[i]) for p in kinds[t] if p.transactional)
        )

    def excludes(self, projector: Projector, campaign_id: str, seq: int) -> bool:
        """Whether `projector` does not get event (campaign_id, seq) in this group."""
        if projector.ordered:
            at = self.stopped.get((campaign_id, projector.name))
            if at is not None and seq >= at:
                return True
        if (campaign_id, seq, projector.name) in self.held:
            return True
        only = self.only.get((campaign_id, seq))
        return (
            only is not None
            and projector.name not in only
            and not (projector.ordered or projector.idempotent)
        )


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
    skips: tuple[Skips, Sequence[str], Sequence[int]] | None = None,
) -> list[Run]:
    """Every transactional subscriber of the group's types, by name, with its events' positions
    less its duplicates (lease-mode projectors run outside the transaction, S13). Positions in
    `journal` (events merged in from the journal) are an ordered projector's alone, or an
    unordered one's the skips say catches up on their campaign, and count in no projector's
    `subscribed`. `skips`, with the group's campaign ids and seqs: events the
    holds keep from a projector, which count in its `subscribed` neither."""
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
                catching = skips[0].catching if skips is not None else ()
                indexes = [
                    i
                    for i in indexes
                    if i not in journal or (skips is not None and (skips[1][i], name) in catching)
                ]
            subscribed = sum(1 for i in indexes if i not in journal)
        if skips is not None:
            kept, cids, seqs = skips
            indexes = [i for i in indexes if not kept.excludes(p, cids[i], seqs[i])]
            subscribed = sum(1 for i in indexes if i not in journal)
        if held := duplicates.get(name):
            indexes = [i for i in indexes if i not in held]
        plan.append(Run(p, subscribed, indexes))
    return plan


def first_unknown(
    types: list[str],
    kinds: dict[str, tuple[Projector, ...]],
    journal: frozenset[int],
    ignored: Collection[str],
) -> int | None:
    """The position of the first claimed event (not in `journal`) that no projector subscribes
    to and whose type is not `ignored`."""
    unknown = {t for t, subs in kinds.items() if not subs and t not in ignored}
    if not unknown:
        return None
    return next((i for i, t in enumerate(types) if t in unknown and i not in journal), None)


def pass_checkpoints(
    campaign_ids: Sequence[str],
    seqs: Sequence[int],
    ordered: Sequence[str],
    checkpoints: dict[CheckpointKey, int],
    stopped: dict[CheckpointKey, int] | None = None,
) -> tuple[dict[str, set[int]], tuple[int, CheckpointGap] | None]:
    """Move every `ordered` projector's checkpoint past each campaign's events of the group
    (sorted by campaign, seq), in place (S17: every ordered checkpoint passes every event it
    is not `stopped` before, S24); return each projector's duplicates (positions at or before
    its checkpoint) and the first gap with its position (none once `outbox.projection.heal`
    has widened the group)."""
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
            stop = end
            if stopped and (held := stopped.get(key)) is not None:
                stop = next((i for i in range(start, end) if seqs[i] >= held), end)
                if stop == start:
                    continue  # none of the campaign's events is its in this group
            elif first == at + 1 and last - first == end - start - 1:
                checkpoints[key] = last  # the seqs right after the checkpoint
                continue
            for index in range(start, stop if gap is None else min(gap[0], stop)):
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


def starting_now(
    registry: Registry,
    firsts: Mapping[str, int],
    checkpoints: Mapping[CheckpointKey, int],
    held: Mapping[CheckpointKey, int] | None = None,
) -> dict[CheckpointKey, int]:
    """Where the ordered projectors that start now (S25) start on the campaigns they have no
    checkpoint on: just before the first event the queue holds for each (`firsts`: campaign
    -> that seq), not at the journal's first; or before the first event a hold of its own
    stands at (`held`: a worker without it left it there, its row gone since)."""
    starts = {
        (cid, name): seq - 1
        for name in registry.starting_now()
        for cid, seq in firsts.items()
        if (cid, name) not in checkpoints
    }
    now = set(registry.starting_now())
    for key, seq in (held or {}).items():
        if key[1] in now and key not in checkpoints:
            starts[key] = min(seq - 1, starts.get(key, seq - 1))
    return starts
