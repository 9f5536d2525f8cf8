"""How many claim loops a worker runs (`outbox.worker.loops`): pure policy, no database."""

from __future__ import annotations

import pytest

from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.model import BatchCounts
from outbox.worker.loops import AUTO_CEILING, Loops, backlog, ceiling_of


def test_the_ceiling_is_the_setting_else_automatic_for_a_pool_of_its_own() -> None:
    assert ceiling_of(Settings(), own_pool=True) == AUTO_CEILING
    assert ceiling_of(Settings(concurrency=8), own_pool=True) == 8
    assert ceiling_of(Settings(), own_pool=False) == 1  # the application's pool: no growth
    assert ceiling_of(Settings(concurrency=2), own_pool=False) == 2
    assert ceiling_of(Settings(max_concurrency=6), own_pool=False) == 6
    assert ceiling_of(Settings(concurrency=2, max_concurrency=2), own_pool=True) == 2


def test_a_ceiling_below_the_concurrency_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(concurrency=4, max_concurrency=2).validate()
    assert str(refused.value) == (
        "OUTBOX_MAX_CONCURRENCY (2) must not be below OUTBOX_CONCURRENCY (4)"
    )


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [
        (10, True),  # a full batch: more is waiting
        (3, False),  # a live trickle, however many campaigns were due
        (0, False),  # nothing claimed: campaigns due are held by other batches
    ],
)
def test_a_backlog_is_a_full_batch(claimed: int, expected: bool) -> None:
    assert backlog(BatchCounts(claimed=claimed), batch_size=10) is expected


def test_loops_grow_one_at_a_time_up_to_the_ceiling_and_count_their_ends() -> None:
    started: list[int] = []
    seen: list[int] = []
    loops = Loops(floor=1, ceiling=3, on_change=seen.append)
    loops.started()
    assert not loops.grow()  # no task group to start one in yet
    loops.start = lambda: started.append(loops.running)
    assert loops.grow()
    assert loops.grow()
    assert not loops.grow()  # at the ceiling
    assert (loops.running, loops.peak, started) == (3, 3, [2, 3])
    assert loops.ended() == 2
    assert loops.ended() == 1
    assert loops.grow()  # room again
    assert seen == [1, 2, 3, 2, 1, 2]
