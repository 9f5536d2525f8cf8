"""Each projector on its own track: what a claimed batch's holds keep from whom (S24).

`Tracks.read()` turns the claimed campaigns' holds and the paused projectors into what the
walk and the dispatch need: the rows whose holders are due (run for those holders alone),
the rows nobody may touch now, each ordered projector stopped on a campaign, and the holds
to retry (an ordered one, or an unordered one's catch-up, goes on through the journal:
`tails`). While the batch runs, a projector that fails on an event gets a hold there (`fail`),
and the batch goes on without it; `leave()` says, at the end, which holds the settle places and
releases, and whether each row is done. Pure: no statement runs here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from outbox.model import Failure, Key
from outbox.projection.plan import Skips
from outbox.projection.registry import Registry
from outbox.queue.claim import ClaimedCampaign, ClaimedRow
from outbox.queue.holds import CATCHING_UP, Hold, HoldKey, HoldWrite

__all__ = ["Away", "Tracks"]


@dataclass(frozen=True, slots=True)
class Away:
    """A projector that owes events but does not run in this batch: paused, or absent from
    this worker's code while the database knows it (a rolling deploy)."""

    name: str
    events: frozenset[str]
    ordered: bool
    paused: bool = False  # else absent from this worker's code


@dataclass
class Tracks:
    """The holds of one batch (see the module docstring)."""

    registry: Registry
    # Seconds until a hold kept for a paused projector is looked at again.
    poll_interval: float
    skips: Skips = field(default_factory=Skips)
    # Rows with holds: the due holders that run them (empty: nobody, the walk steps over it).
    attached: dict[Key, frozenset[str]] = field(default_factory=dict)
    # campaign -> projectors whose due hold this batch takes on through the journal (an
    # ordered one's, an unordered one's catch-up).
    tails: dict[str, set[str]] = field(default_factory=dict)
    # Holds as the claim read them, and those the batch retries or replaces.
    found: dict[HoldKey, Hold] = field(default_factory=dict)
    released: set[HoldKey] = field(default_factory=set)
    placed: dict[HoldKey, HoldWrite] = field(default_factory=dict)
    # Holds left (or placed) for a paused projector, and for one not in this worker's code
    # (another worker's): a drain ends rather than wait for them.
    waiting: int = 0
    elsewhere: int = 0

    def read(
        self,
        campaigns: list[ClaimedCampaign],
        paused: Collection[str],
        absent: Sequence[Away],
        *,
        go_on: bool = True,
        others: Collection[str] = (),
    ) -> None:
        """Learn the claimed campaigns' holds: who is stopped, which rows wait for whom. A due
        hold of a projector `paused` or `absent` (not in this worker's code) is looked at again
        in a poll interval. Without `go_on` (a batch that serves appends first, S25) an ordered
        projector's due hold stays as it is, stopping it, for a background batch to go on
        from. The holds of projectors `others` (served by another worker group, S35) are that
        group's queue: not read."""
        projectors = self.registry.projectors
        away = {a.name: a for a in absent}
        for campaign in campaigns:
            if not campaign.holds:
                continue
            cid = campaign.campaign_id
            # Rows under a live lease (a retry's): their holds are that lease's until it ends.
            leased = {r.seq for r in campaign.rows if r.status == "processing" and not r.due}
            for hold in campaign.holds:
                if hold.projector in others:
                    continue
                self.found[(cid, hold.projector, hold.seq)] = hold
                due = hold.due and hold.seq not in leased
                p = projectors.get(hold.projector)
                ordered = (
                    p.ordered
                    if p is not None
                    else away[hold.projector].ordered
                    if hold.projector in away
                    else hold.seq == CATCHING_UP
                )
                retry = due and p is not None and hold.projector not in paused
                if due and not retry:  # paused or absent: looked at again later
                    self._keep(cid, hold, self.poll_interval)
                    self._count(hold.projector in paused)
                if ordered:
                    if retry and go_on:
                        self.tails.setdefault(cid, set()).add(hold.projector)
                    else:  # from the event it failed on (its checkpoint may be before it)
                        self.skips.stop(cid, hold.projector, hold.seq)
                elif hold.seq == CATCHING_UP and retry and go_on:
                    # An unordered catch-up: its rows go on meanwhile, through its markers.
                    self.tails.setdefault(cid, set()).add(hold.projector)
                if hold.seq != CATCHING_UP:
                    key = (cid, hold.seq)
                    holders = self.attached.get(key, frozenset())
                    self.attached[key] = holders | {hold.projector} if retry else holders
                    if not retry and not ordered:
                        self.skips.held.add((cid, hold.seq, hold.projector))
        self.skips.only.update((k, v) for k, v in self.attached.items() if v)

    def wait_for(self, rows: list[ClaimedRow], away: Sequence[Away]) -> None:
        """The chosen `rows` a projector `away` (paused, or absent from this worker's code)
        subscribes to wait for it alone: an ordered one stops on the row's campaign, an
        unordered one on that row (a hold each, looked at again in one poll interval); the
        others apply them."""
        for p in sorted(away, key=lambda a: a.name):
            name = p.name
            for row in rows:
                # A row with holds is its holders' alone (`read` dealt with them).
                if row.event_type not in p.events or row.key in self.attached:
                    continue
                cid, wait = row.campaign_id, self.poll_interval
                if p.ordered:  # at the first event it owes: where one that starts now starts
                    if (cid, name) not in self.skips.stopped:
                        self.skips.stop(cid, name, row.seq)
                        self._place(cid, name, row.seq, "pending", 0, None, False, wait)
                        self._count(p.paused)
                else:
                    self.skips.held.add((cid, row.seq, name))
                    self._place(cid, name, row.seq, "pending", 0, None, True, wait)
                    self._count(p.paused)

    def _count(self, paused: bool) -> None:
        """One hold left waiting: for a paused projector, or for one another worker runs."""
        if paused:
            self.waiting += 1
        else:
            self.elsewhere += 1

    def defer(self, row: ClaimedRow, names: Sequence[str]) -> None:
        """The lease-mode projectors `names` of a row that is not leased now (a subscriber of
        its event waits elsewhere) each get a hold on it, due now: a later batch leases the row
        for them alone."""
        for name in names:
            self.skips.held.add((row.campaign_id, row.seq, name))
            self._place(row.campaign_id, name, row.seq, "pending", 0, None, True, 0.0)

    def leasing(self, key: Key, holders: Collection[str], seconds: float) -> None:
        """A row leased to retry its `holders`' holds: each is due again when the lease would
        expire (the worker died with it), not before."""
        cid, seq = key
        for name in holders:
            hold = self.found.get((cid, name, seq))
            if hold is not None:
                self._keep(cid, hold, seconds)

    def defer_behind(
        self, campaigns: list[ClaimedCampaign], checkpoints: dict[tuple[str, str], int], gap: int
    ) -> None:
        """An ordered projector more than `gap` events behind a claimed campaign's first row
        (deployed onto its history) is not healed in this batch: it stops there with a
        catch-up hold, due now, for a background batch to take on through the journal (S25),
        and the campaign's other projectors apply the rows now."""
        for c in campaigns:
            if not c.rows:
                continue
            cid, first = c.campaign_id, c.rows[0].seq
            for name in self.registry.ordered_names():
                stopped = (cid, name) in self.skips.stopped or name in self.tails.get(cid, ())
                if not stopped and first - 1 - checkpoints.get((cid, name), 0) > gap:
                    self.skips.stop(cid, name, CATCHING_UP)
                    self._place(cid, name, CATCHING_UP, "pending", 0, None, False, 0.0)

    def fail(self, failure: Failure, *, event_type: str | None) -> None:
        """`failure.projector` failed on event (campaign, seq): it gets a hold there, which
        stands for the event's work row, and the group goes on without it (an ordered projector
        stops on the campaign). `event_type`: the event was met in the journal (its row went):
        the row is made again."""
        name = failure.projector
        assert name is not None
        cid, seq = failure.campaign_id, failure.seq
        p = self.registry.projectors[name]
        if p.ordered:
            self.skips.stop(cid, name, seq)
            self.tails.get(cid, set()).discard(name)
            for key in [k for k in self.found if k[0] == cid and k[1] == name and k[2] != seq]:
                self.released.add(key)
        else:
            self.skips.held.add((cid, seq, name))
        status = "dead" if failure.dead else "failed"
        write = HoldWrite(
            cid,
            name,
            seq,
            status,
            failure.attempts,
            failure.delay,
            failure.error,
            True,
            event_type,
        )
        self.placed[write.key] = write

    def first_holds(self) -> dict[tuple[str, str], int]:
        """(campaign, projector) -> the first event a hold the claim read stands at (catch-up
        holds aside, but a worker group's, which says where, S35)."""
        firsts: dict[tuple[str, str], int] = {}
        for (cid, name, seq), hold in self.found.items():
            at = seq if seq != CATCHING_UP else hold.from_seq
            if at is not None:
                firsts[(cid, name)] = min(at, firsts.get((cid, name), at))
        return firsts

    def attempts(self, campaign_id: str, projector: str, seq: int) -> int:
        """Attempts `projector` made at the event so far (its hold's, 0 for none)."""
        hold = self.found.get((campaign_id, projector, seq))
        if hold is None:  # a worker group's hold stands at seq 0 and says at which event (S35)
            hold = self.found.get((campaign_id, projector, CATCHING_UP))
            if hold is None or hold.from_seq != seq or hold.status == "pending":
                return 0
        return hold.attempts

    def caught_up(self, campaign_id: str, projector: str, *, done: bool) -> None:
        """A retried hold went on through the journal: released when the projector reached the
        journal's end (`done`), else kept pending, due now, for the next batch to go on. An
        unordered projector's holds on single events stay (its catch-up passed them)."""
        ordered = self.registry.projectors[projector].ordered
        for key in [k for k in self.found if k[0] == campaign_id and k[1] == projector]:
            if key not in self.placed and (ordered or key[2] == CATCHING_UP):
                self.released.add(key)
        if not done:
            self._place(campaign_id, projector, CATCHING_UP, "pending", 0, None, False, 0.0)

    def applied(self, keys: Collection[Key]) -> None:
        """The retried holds of unordered projectors on these rows went through."""
        if not self.attached:
            return
        for cid, seq in keys:
            for name in self.attached.get((cid, seq), ()):
                key = (cid, name, seq)
                p = self.registry.projectors.get(name)
                if p is not None and not p.ordered and key not in self.placed:
                    self.released.add(key)

    def holds_row(self, key: Key) -> bool:
        """Whether a hold stands for row `key` after the batch (the row stays)."""
        if self.quiet:
            return False
        placed, kept = self._on_row(key)
        return any(w.row for w in placed) or bool(kept)

    def retried_campaigns(self) -> set[str]:
        """The campaigns whose holds this batch retries (due, their projector here)."""
        return set(self.tails) | {cid for (cid, _), holders in self.attached.items() if holders}

    @property
    def quiet(self) -> bool:
        """No hold was read or placed: every row is everyone's (the healthy path)."""
        return not (self.found or self.placed)

    def failed_on(self, key: Key) -> bool:
        """Whether a projector failed on row `key` in this batch."""
        placed, _ = self._on_row(key)
        return any(w.status != "pending" for w in placed)

    def row_waits(self, key: Key) -> bool:
        """Whether a hold on row `key` that is not dead is left after the batch."""
        placed, kept = self._on_row(key)
        return any(w.status != "dead" for w in placed) or any(h.status != "dead" for h in kept)

    def _on_row(self, key: Key) -> tuple[list[HoldWrite], list[Hold]]:
        """The holds on row `key` after the batch: those it places, and those the claim read
        that stay as they were."""
        cid, seq = key
        placed = [w for k, w in self.placed.items() if k[0] == cid and k[2] == seq]
        kept = [h for k, h in self.found.items() if k[0] == cid and k[2] == seq and self._kept(k)]
        return placed, kept

    def _kept(self, key: HoldKey) -> bool:
        """Whether a hold the claim read stays as it was (neither released nor replaced)."""
        return key not in self.released and key not in self.placed

    def left(self, campaign_id: str) -> tuple[list[Hold], list[HoldWrite]]:
        """The campaign's holds after the batch: those the claim read that stay as they were,
        and those the batch places."""
        if self.quiet:
            return [], []
        kept = [h for k, h in self.found.items() if k[0] == campaign_id and self._kept(k)]
        return kept, [w for k, w in self.placed.items() if k[0] == campaign_id]

    def _keep(self, campaign_id: str, hold: Hold, delay: float) -> None:
        """A due hold left as it is, looked at again in `delay` seconds."""
        row = hold.seq != CATCHING_UP
        self._place(
            campaign_id, hold.projector, hold.seq, hold.status, hold.attempts, None, row, delay
        )

    def _place(
        self,
        campaign_id: str,
        projector: str,
        seq: int,
        status: str,
        attempts: int,
        error: str | None,
        row: bool,
        delay: float,
    ) -> None:
        write = HoldWrite(campaign_id, projector, seq, status, attempts, delay, error, row)
        self.placed[write.key] = write
