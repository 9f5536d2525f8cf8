"""What a claim loop does after a batch: a pure function of what the batch reported.

The service's loops (`service.Service.claim_loop`) run a batch, then ask `next_step`: claim
again at once, look again shortly, wait for a wake-up, wait out what is not due yet (a drain),
or end (a drain with nothing left to take). No I/O, no clock: unit-tested case by case.
"""

from __future__ import annotations

from enum import Enum

from outbox.model import BatchCounts

__all__ = ["Step", "next_step"]


class Step(Enum):
    CLAIM = "claim"  # more is due now: claim again at once
    RECHECK = "recheck"  # a campaign was due with nothing in it: an append in flight, look soon
    IDLE = "idle"  # nothing due now: wait for a NOTIFY, at most until work falls due by time
    DUE = "due"  # a drain waiting out backoffs: until the next work falls due, end if none
    END = "end"  # a drain found nothing left to take


def next_step(
    counts: BatchCounts,
    *,
    batch_size: int,
    took_all: bool,
    until_idle: bool,
    wait_out_backoff: bool,
) -> Step:
    """The loop's next step after a batch that reported `counts`.

    `took_all`: the worker's last claim took all it could (an ordered claim that met its
    campaign limit leaves more due); `until_idle`: the service is a drain, which
    ends at the first claim that finds nothing (with `wait_out_backoff`, once nothing left can
    come due by itself: a paused projector's events never do, nor those of a projector that
    other workers run)."""
    if not (counts.claimed or counts.more_due) and took_all and until_idle:
        waiting = counts.paused or counts.elsewhere
        return Step.DUE if wait_out_backoff and not waiting else Step.END
    if counts.claimed >= batch_size or not took_all:
        return Step.CLAIM  # a full batch, or a claim that met its campaign limit
    if counts.more_due:
        # Campaigns left due: claim again, at once when this batch did work; one that yielded
        # nothing waits for an append still in flight.
        return Step.CLAIM if counts.claimed else Step.RECHECK
    return Step.CLAIM if until_idle else Step.IDLE
