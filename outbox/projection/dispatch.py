"""Dispatch of a group of events to the registered projectors, under the exactly-once guards.

`Dispatch` serves one batch (or one inline append, or one replay) on the caller's connection,
inside the caller's transaction. `load()` locks the checkpoints of the batch's campaigns in one
statement (or `use()` takes those an ordered claim locked). `apply(events)` runs a group of
events (the caller brackets it with `open_group()` and, on failure, `undo_group()`): it derives
every ordered projector's verdict (apply / duplicate / gap) from those checkpoints and the seqs,
a campaign at a time, reserves the processed markers of every idempotent projector in one
statement, runs per-event projectors event by event and batch projectors once with an
`EventBatch` of their events. An ordered projector behind a campaign (deployed onto its history,
rows deleted by hand) first gets the events it lacks from the journal, in the same group
(`outbox.projection.heal`); a campaign with more to catch up than a group takes comes back
`BEHIND`: its rows wait, charged nothing. What the holds keep from a projector (`Skips`, S24)
it never gets; `catch_up()` takes an ordered projector whose hold is due on through the
journal. `moves()` says where the checkpoints moved, for the caller's settle
(`outbox.queue.settle`, the one statement that writes them). The happy path pays no per-event
round trip of the library's own, and builds no per-event object a batch projector does not ask
for.

A failure is raised as `GroupFailed` (`outbox.projection.outcome`), carrying the index of the
event it belongs to when known (a per-event projector, a gap, an unknown type) and the projector
that raised, so the caller can isolate it or hold that projector alone. This module
never claims, deletes or retries work rows, never opens a transaction of its own, and holds no
SQL: the guards' statements are `outbox.projection.guards`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING

from outbox.errors import UnknownEventType
from outbox.model import EventBatch, StoredEvent, Unsubscribed
from outbox.obs import tracing
from outbox.projection.guards import (
    CheckpointKey,
    lock_checkpoints,
    open_group,
    reserve_markers,
    undo_group,
)
from outbox.projection.heal import HEAL_EVENTS, journal_tail, widen
from outbox.projection.outcome import ApplyOutcome, GroupFailed, announce_unsubscribed
from outbox.projection.plan import Run, Skips, first_unknown, pass_checkpoints, plan_runs
from outbox.projection.registry import Projector, Registry
from outbox.queue.settle import settle

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["ApplyOutcome", "Dispatch", "GroupFailed", "apply_event"]


@dataclass
class Dispatch:
    """Guards and dispatch for one batch on `conn` (see the module docstring)."""

    conn: Connection
    registry: Registry
    # What happens to an event no projector subscribes to (OUTBOX_UNSUBSCRIBED): `skip`
    # completes it, `retry` fails it (UnknownEventType) until a projector for it is deployed.
    unsubscribed: Unsubscribed = "skip"
    # The bucket every event of the batch is in (a worker's batch claims in one); None: each
    # campaign's, worked out by the guards' statements.
    bucket: int | None = None
    # Journal events a group may apply to ordered projectors behind its campaigns (None: no
    # bound; 0: none, and such a campaign's events come back BEHIND).
    heal: int | None = HEAL_EVENTS
    checkpoints: dict[CheckpointKey, int] = field(default_factory=dict)
    moved: set[CheckpointKey] = field(default_factory=set)
    # For metrics: events per (projector, outcome) of the groups that applied ("applied", or
    # "skipped" by the projector's guard) plus each failure ("failed"), and every call's time.
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[tuple[str, float]] = field(default_factory=list)
    # Events completed unsubscribed, per type (for the metric).
    skipped_types: Counter[str] = field(default_factory=Counter)
    # Types a projector away from this batch subscribes to (paused, or run by other workers):
    # an event of one that no projector here runs waits in their holds, so it is neither
    # unsubscribed nor unknown (S8, S24).
    awaited: frozenset[str] = frozenset()

    async def load(self, campaigns: Sequence[str], *, held: bool = False) -> None:
        """Lock and read the ordered projectors' checkpoints of `campaigns` (one statement).

        `held`: the caller holds the campaigns against every other applier (an append's head,
        a campaign row), so a missing checkpoint reads as 0. Otherwise missing rows are
        created first and locked, so two concurrent applications of a campaign's first events
        cannot both read "missing" and apply them twice (two more statements, only then)."""
        ordered = self.registry.ordered_names()
        if not ordered or not campaigns:
            return
        self.checkpoints.update(
            await lock_checkpoints(
                self.conn, sorted(set(campaigns)), ordered, held=held, bucket=self.bucket
            )
        )

    def use(self, checkpoints: dict[CheckpointKey, int], *, write: bool = False) -> None:
        """Take checkpoints the caller already locked (an ordered claim reads them); `write`:
        ones it sets, written with the batch (`plan.starting_now`, S25)."""
        self.checkpoints.update(checkpoints)
        self.moved |= checkpoints.keys() if write else set()

    async def open_group(self) -> None:
        await open_group(self.conn)

    async def undo_group(self) -> None:
        await undo_group(self.conn)

    async def apply(
        self, events: Sequence[StoredEvent], skips: Skips | None = None
    ) -> list[ApplyOutcome]:
        """Apply `events` (sorted by campaign_id, seq) once each; call inside a savepoint.
        Raises GroupFailed; on success the checkpoints move (in memory until `settle`).
        `skips`: what the holds keep from which projector (S24).

        First the events ordered projectors lack are merged in from the journal (`heal`);
        a failure on one of them is charged to its campaign's next claimed event. A campaign
        the heal budget cannot bring level comes back BEHIND, its checkpoints moved as far as
        the budget took them. The journal lacking a seq fails the event after it
        (`CheckpointGap`, dead at once)."""
        checkpoints = dict(self.checkpoints)
        ordered = self.registry.ordered_names()
        skips = skips or None
        wide = await widen(
            self.conn,
            events,
            ordered,
            checkpoints,
            budget=self.heal,
            bucket=self.bucket,
            stopped=skips.stopped if skips is not None else None,
        )
        if wide is None:
            outcomes = await self._apply(events, checkpoints, frozenset(), skips)
        else:
            if wide.gaps:
                index = min(wide.gaps)
                gap = GroupFailed(wide.gaps[index], index)
                types = [e.type for e in events]
                kinds = {t: self.registry.subscribers(t) for t in set(types)}
                raise self._first_failure(types, kinds, frozenset(), gap) or gap
            try:
                applied = (
                    await self._apply(wide.events, checkpoints, frozenset(wide.journal), skips)
                    if wide.events
                    else []
                )
            except GroupFailed as failed:
                charged = None if failed.index is None else wide.charge[failed.index]
                raise GroupFailed(
                    failed.cause, charged, failed.projector, failed.event, failed.event_type
                ) from failed.cause
            outcomes = [ApplyOutcome.BEHIND if p is None else applied[p] for p in wide.placed]
        self.moved |= {k for k, v in checkpoints.items() if self.checkpoints.get(k) != v}
        self.checkpoints = checkpoints
        return outcomes

    async def catch_up(
        self, tails: dict[str, set[str]], held: Collection[tuple[str, int, str]] = ()
    ) -> tuple[set[CheckpointKey], int]:
        """Take each campaign's projectors in `tails` on from their checkpoints through the
        journal, at most `heal` events in all (call inside a savepoint; raises GroupFailed
        naming the projector and event that failed); return the (campaign, projector) pairs
        that reached the journal's end, and how many events it applied. The campaign's other
        projectors get nothing. An unordered projector's checkpoint is its catch-up cursor: its
        markers skip what it applied from the rows, and the events `held` from it (a hold of
        its own, failed there) are passed over, the cursor moving past them (S25)."""
        if not tails:
            return set(), 0
        budget = self.heal if self.heal is not None else HEAL_EVENTS
        share = max(1, budget // len(tails))
        starts = {
            cid: min(self.checkpoints.get((cid, name), 0) for name in names) + 1
            for cid, names in tails.items()
        }
        events, unavailable = await journal_tail(self.conn, starts, share, bucket=self.bucket)
        for cid, (seq, exc) in sorted(unavailable.items()):
            raise GroupFailed(exc, None, min(tails[cid]), (cid, seq))  # no type to make a row
        reached = {
            (cid, name)
            for cid, names in tails.items()
            for name in names
            if sum(1 for e in events if e.campaign_id == cid) < share
        }
        if not events:
            return reached, 0
        skips = Skips.catching_up(self.registry, tails, held)
        checkpoints = dict(self.checkpoints)
        try:
            outcomes = await self._apply(events, checkpoints, frozenset(range(len(events))), skips)
        except GroupFailed as failed:
            if failed.projector is not None or failed.index is None:
                raise
            at = events[failed.index]  # a gap in the journal: the projector stops there
            name = min(tails[at.campaign_id])
            raise GroupFailed(failed.cause, None, name, (at.campaign_id, at.seq), at.type) from None
        last = {e.campaign_id: e.seq for e in events}  # sorted: each campaign's last read
        for cid, name in skips.catching:  # the cursor passes every event read
            if cid in last:
                checkpoints[(cid, name)] = last[cid]
        self.moved |= {k for k, v in checkpoints.items() if self.checkpoints.get(k) != v}
        self.checkpoints = checkpoints
        return reached, outcomes.count(ApplyOutcome.APPLIED)

    async def _apply(
        self,
        events: Sequence[StoredEvent],
        checkpoints: dict[CheckpointKey, int],
        journal: frozenset[int],
        skips: Skips | None = None,
    ) -> list[ApplyOutcome]:
        """The guards work on the group, not event by event: subscribers per distinct type, each
        ordered checkpoint per campaign (one comparison when the campaign's seqs are the ones
        after it, the usual case; event by event only where some are duplicates or a gap), the
        markers in one statement. Each projector gets the positions of its events; a batch
        projector an `EventBatch` of them, built from the group's columns. `checkpoints` move
        in place."""
        batch = EventBatch.of(events)
        registry = self.registry
        types = batch.types
        kinds = {t: registry.subscribers(t) for t in set(types)}
        duplicates, gap = pass_checkpoints(
            batch.campaign_ids,
            batch.seqs,
            registry.ordered_names(),
            checkpoints,
            skips.stopped if skips is not None else None,
        )
        refused = self._first_failure(
            types, kinds, journal, None if gap is None else GroupFailed(gap[1], gap[0])
        )
        if refused is not None:
            raise refused
        plan = plan_runs(
            types,
            kinds,
            duplicates,
            journal,
            None if skips is None else (skips, batch.campaign_ids, batch.seqs),
        )
        await self._reserve_markers(batch, plan)
        try:
            await self._run(batch, plan, journal)
        except GroupFailed as failed:
            if failed.projector is not None:
                self.tally[(failed.projector, "failed")] += 1
            raise
        for run in plan:
            if run.indexes:
                self.tally[(run.projector.name, "applied")] += len(run.indexes)
            claimed = (
                sum(1 for i in run.indexes if i not in journal) if journal else len(run.indexes)
            )
            if claimed < run.subscribed:
                self.tally[(run.projector.name, "skipped")] += run.subscribed - claimed
        held = None if skips is None else skips.positions(types, kinds, batch)
        return self._outcomes(types, kinds, plan, journal=journal, held=held)

    def _first_failure(
        self,
        types: list[str],
        kinds: dict[str, tuple[Projector, ...]],
        journal: frozenset[int],
        found: GroupFailed | None,
    ) -> GroupFailed | None:
        """The group's first failing event, the one to isolate: `found` (a gap), or before it,
        under OUTBOX_UNSUBSCRIBED=retry, a claimed event no projector subscribes to."""
        index = (
            first_unknown(types, kinds, journal, self.registry.ignored | self.awaited)
            if self.unsubscribed == "retry"
            else None
        )
        if index is not None and (found is None or index < (found.index or 0)):
            why = f"no projector subscribes to event type {types[index]!r}"
            return GroupFailed(UnknownEventType(why), index)
        return found

    def _outcomes(
        self,
        types: list[str],
        kinds: dict[str, tuple[Projector, ...]],
        plan: list[Run],
        *,
        journal: frozenset[int] = frozenset(),
        held: frozenset[int] | None = None,
    ) -> list[ApplyOutcome]:
        """Each event's outcome: applied when a projector ran it, held when none did and a
        hold kept it from one (positions `held`), duplicate when every subscriber's guard had
        (or only lease-mode projectors subscribe), ignored, or unsubscribed (counted per type,
        announced once). Events merged in from the `journal` were counted when they were
        claimed."""
        by_type: dict[str, ApplyOutcome] = {}
        for t, subs in kinds.items():
            if any(p.transactional for p in subs):
                by_type[t] = ApplyOutcome.APPLIED
            elif subs:
                by_type[t] = ApplyOutcome.DUPLICATE
            elif t in self.registry.ignored:
                by_type[t] = ApplyOutcome.IGNORED
            elif t in self.awaited:
                by_type[t] = ApplyOutcome.HELD
            else:
                by_type[t] = ApplyOutcome.UNSUBSCRIBED
                self.skipped_types[t] += (
                    sum(1 for i, x in enumerate(types) if x == t and i not in journal)
                    if journal
                    else types.count(t)
                )
                announce_unsubscribed(t)
        outcomes = [by_type[t] for t in types]
        if journal or held or any(len(run.indexes) < run.subscribed for run in plan):  # a guard
            # or a hold kept some back (a widened group's count says nothing: its journal
            # events are extra)
            ran = {i for run in plan for i in run.indexes}
            for index, outcome in enumerate(outcomes):
                if outcome is ApplyOutcome.APPLIED and index not in ran:
                    outcomes[index] = (
                        ApplyOutcome.HELD if held and index in held else ApplyOutcome.DUPLICATE
                    )
        return outcomes

    async def _reserve_markers(self, batch: EventBatch, plan: list[Run]) -> None:
        """One statement for the group; a projector whose marker exists drops the event."""
        marked = [run for run in plan if run.projector.idempotent and not run.projector.ordered]
        cids, seqs = batch.campaign_ids, batch.seqs
        wanted = [(cids[i], seqs[i], run.projector.name) for run in marked for i in run.indexes]
        if not wanted:
            return
        reserved = await reserve_markers(self.conn, wanted, bucket=self.bucket)
        for run in marked:
            name = run.projector.name
            run.indexes = [i for i in run.indexes if (cids[i], seqs[i], name) in reserved]

    async def _run(self, batch: EventBatch, plan: list[Run], journal: frozenset[int]) -> None:
        """Per-event projectors event by event (by name within an event), then each batch
        projector once, in the order of its first event."""
        per_event = [run for run in plan if not run.projector.batch and run.indexes]
        steps = sorted((i, k) for k, run in enumerate(per_event) for i in run.indexes)
        for index, k in steps:
            await self._call(per_event[k].projector, batch, [index], journal)
        batches = [run for run in plan if run.projector.batch and run.indexes]
        for run in sorted(batches, key=lambda run: run.indexes[0]):
            await self._call(run.projector, batch, run.indexes, journal)

    async def _call(
        self, projector: Projector, batch: EventBatch, at: Sequence[int], old: frozenset[int]
    ) -> None:
        """Run `projector` on the events at indexes `at` (which one failed is known only when
        it had one); when all came from the journal (`old`: a catch-up, a heal), it replays."""
        events = batch.take(at) if projector.batch else [batch[i] for i in at]
        index, replaying = (at[0] if len(at) == 1 else None), old.issuperset(at)
        started = perf_counter()
        attributes = {"outbox.projector": projector.name, "outbox.events": len(events)}
        try:
            with tracing.span("outbox.project", attributes=attributes, events=events):
                await projector.run(self.conn, events, replaying=replaying)
        except Exception as exc:
            one = events[0] if len(events) == 1 else None
            event = None if one is None else (one.campaign_id, one.seq)
            raise GroupFailed(
                exc, index, projector.name, event, None if one is None else one.type
            ) from exc
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
    dispatch = Dispatch(conn, registry, unsubscribed, heal=None)
    await dispatch.load([event.campaign_id])
    try:
        (outcome,) = await dispatch.apply([event])
    except GroupFailed as failed:
        raise failed.cause from None
    await settle(conn, checkpoints=dispatch.moves())
    return outcome
