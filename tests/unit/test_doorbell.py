"""The doorbell that wakes the claim loops: one loop per ring, every loop for ring_all and
close, and a ring that finds no loop waiting kept for the next one."""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup

from outbox.worker.signals import Doorbell


async def _wait_in(tg: TaskGroup, bell: Doorbell, n: int) -> list[int]:
    """Start `n` tasks waiting on `bell`; each appends its index to the list once woken."""
    woken: list[int] = []

    async def wait(i: int) -> None:
        await bell.wait()
        woken.append(i)

    for i in range(n):
        tg.start_soon(wait, i)
    await anyio.wait_all_tasks_blocked()
    return woken


async def test_a_ring_wakes_one_waiting_loop() -> None:
    bell = Doorbell()
    async with anyio.create_task_group() as tg:
        woken = await _wait_in(tg, bell, 2)
        bell.ring()
        await anyio.wait_all_tasks_blocked()
        assert woken == [0]  # the first to wait; the other sleeps on
        bell.ring()
    assert woken == [0, 1]


async def test_a_ring_with_nobody_waiting_lets_the_next_wait_go_at_once() -> None:
    bell = Doorbell()
    bell.ring()
    bell.ring()  # rings do not pile up: the loop that goes claims everything due
    with anyio.fail_after(5):
        await bell.wait()
    with anyio.move_on_after(0.05) as scope:
        await bell.wait()
    assert scope.cancelled_caught


async def test_ring_all_and_close_wake_every_loop() -> None:
    bell = Doorbell()
    async with anyio.create_task_group() as tg:
        woken = await _wait_in(tg, bell, 3)
        bell.ring_all()
    assert sorted(woken) == [0, 1, 2]
    async with anyio.create_task_group() as tg:
        woken = await _wait_in(tg, bell, 2)
        bell.close()
    assert sorted(woken) == [0, 1]
    with anyio.fail_after(5):  # closed for good: no wait blocks again
        await bell.wait()


async def test_a_wait_that_timed_out_does_not_take_the_next_ring() -> None:
    bell = Doorbell()
    with anyio.move_on_after(0.01):
        await bell.wait()
    async with anyio.create_task_group() as tg:
        woken = await _wait_in(tg, bell, 1)
        bell.ring()
    assert woken == [0]
