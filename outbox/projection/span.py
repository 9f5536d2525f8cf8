"""What one step of the catch-up engine (`build.py`, S30) applies: the journal ranges of the
campaigns it locked, within a budget counted in the projector's events, not in the journal's
positions.

`plan()` goes through a step's locked campaigns in key order and gives each the range from its
checkpoint (in place: a campaign not reset yet, from its first event) to its head, until the
ranges span `span` positions, the last one cut there. The engine reads only the projector's
types of those ranges, by the journal's type index (`load_ranges` with `types`), so positions of
other types cost nothing; and when the span is wider than the budget, `trim()` counts the
projector's events in each range by that index and keeps the ranges within the budget.

The span follows what the steps found (`Span`): the budget's worth of positions for a projector
whose types fill the journal, up to `SPREAD` times that for one whose types are sparse, so that
a projector of 1% of the journal's events applies full steps and reads only its own events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from outbox import db

__all__ = ["SPREAD", "Plan", "Range", "Span", "plan", "trim"]

# At most, journal positions a step spans for each event of its budget: a projector whose types
# are 1 in 200 of the journal's events (or fewer) still fills a step's budget.
SPREAD = 200

# A journal range a step applies: (campaign, first seq, last seq, whether that is the head,
# whether an in-place rebuild resets the campaign first).
Range = tuple[str, int, int, bool, bool]
# How many of the projector's events each range holds (a campaign with none left out).
Count = Callable[[Sequence[Range]], Awaitable[dict[str, int]]]


@dataclass
class Plan:
    """A step's ranges, each with the index of its campaign's row (`at`); how many of the
    step's rows it is done with (`stop`: the next step looks after them; None: all it looked
    at); whether it stopped to wait for a batch that holds a campaign an in-place rebuild must
    reset (`waiting`)."""

    ranges: list[Range] = field(default_factory=list)
    at: list[int] = field(default_factory=list)
    stop: int | None = None
    waiting: bool = False

    def positions(self) -> int:
        """The journal positions the ranges span."""
        return sum(hi - lo + 1 for _, lo, hi, _, _ in self.ranges)


def plan(rows: Sequence[db.Record], *, in_place: bool, reset_after: str | None, span: int) -> Plan:
    """The ranges of a step's rows (`outbox_build_step`'s, in key order) up to `span` positions.
    In place, a campaign after `reset_after` (the bucket's last reset, None: none) is reset and
    applied from its first event; one a batch holds is waited for, where a catch-up skips it."""
    p, left = Plan(), span
    for i, r in enumerate(rows):
        campaign = r["campaign_id"]
        fresh = in_place and (reset_after is None or campaign > reset_after)
        if not r["locked"]:
            if fresh:  # reset every campaign: wait for the batch that holds this one
                p.stop, p.waiting = i, True
                break
            continue  # skipped: a batch holds it
        applied, head = (0 if fresh else r["applied_seq"]), r["last_seq"] or 0
        if applied >= head and not fresh:
            continue
        last = min(head, applied + left)
        p.ranges.append((campaign, applied + 1, last, last == head, fresh))
        p.at.append(i)
        left -= last - applied
        if left <= 0:
            # Cut here: a campaign cut short and those after it are looked at again.
            p.stop = i + 1 if last == head else i
            break
    return p


async def trim(p: Plan, count: Count, events: int) -> None:
    """Keep `p`'s ranges within `events` of the projector's events (`count`): the ranges up to
    the one that would pass it, looked at again by the next step; when that is the first, its
    range cut short, counted again until it holds no more than `events`."""
    counts = await count(p.ranges)
    left = events
    for k, (campaign, lo, hi, _, fresh) in enumerate(p.ranges):
        n = counts.get(campaign, 0)
        if n <= left:
            left -= n
            continue
        p.stop = p.at[k]  # this campaign on: looked at again
        if k > 0:
            del p.ranges[k:], p.at[k:]
        else:
            while n > events:  # shorter by the share that fits; each try is shorter
                hi = lo + max(1, (hi - lo + 1) * events // n) - 1
                one: Range = (campaign, lo, hi, False, fresh)
                n = (await count([one])).get(campaign, 0)
            p.ranges[:] = [(campaign, lo, hi, False, fresh)]
            del p.at[1:]
        return


@dataclass
class Span:
    """The positions a step spans: the budget's worth at first, then as many as held the
    budget's worth of the projector's events in the steps before (at most `SPREAD` times)."""

    positions: int

    def found(self, positions: int, applied: int, events: int) -> None:
        """What a step spanned and applied of the projector's events, `events` its budget."""
        if positions < events:  # too few to tell (the bucket's end)
            return
        wanted = positions * events // max(applied, 1)
        self.positions = max(events, min(events * SPREAD, wanted))
