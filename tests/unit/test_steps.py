"""What a claim loop does after a batch (`outbox.worker.steps.next_step`), case by case."""

from __future__ import annotations

import pytest

from outbox.model import BatchCounts
from outbox.worker.steps import Step, next_step

SERVE = {"until_idle": False, "wait_out_backoff": False}
DRAIN_NOW = {"until_idle": True, "wait_out_backoff": False}
DRAIN = {"until_idle": True, "wait_out_backoff": True}


@pytest.mark.parametrize(
    ("counts", "took_all", "mode", "step"),
    [
        # A full batch: more is due, whatever the mode.
        (BatchCounts(claimed=10), True, SERVE, Step.CLAIM),
        (BatchCounts(claimed=10), True, DRAIN, Step.CLAIM),
        # The claim met its campaign limit: more campaigns wait.
        (BatchCounts(claimed=3), False, SERVE, Step.CLAIM),
        (BatchCounts(), False, DRAIN_NOW, Step.CLAIM),
        # Campaigns left due: at once after work, shortly after an empty claim.
        (BatchCounts(claimed=3, more_due=2), True, SERVE, Step.CLAIM),
        (BatchCounts(more_due=1), True, SERVE, Step.RECHECK),
        (BatchCounts(more_due=1), True, DRAIN, Step.RECHECK),
        # Nothing due now: a serving loop waits for a wake-up; a drain claims until it finds
        # nothing, then ends, or waits out backoffs.
        (BatchCounts(claimed=3), True, SERVE, Step.IDLE),
        (BatchCounts(), True, SERVE, Step.IDLE),
        (BatchCounts(claimed=3), True, DRAIN_NOW, Step.CLAIM),
        (BatchCounts(), True, DRAIN_NOW, Step.END),
        (BatchCounts(), True, DRAIN, Step.DUE),
        # A paused projector's events never come due by themselves: a drain ends.
        (BatchCounts(paused=2), True, DRAIN, Step.END),
    ],
)
def test_the_next_step_after_a_batch(
    counts: BatchCounts, took_all: bool, mode: dict[str, bool], step: Step
) -> None:
    assert next_step(counts, batch_size=10, took_all=took_all, **mode) is step
