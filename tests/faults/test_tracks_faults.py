"""Each projector on its own track under SIGKILLs (S24, S25): a line per projector.

Three worker processes run `faults_app`'s projectors while the generator appends and workers
are killed (SIGKILL) and restarted at random. The oracle is the generator's own record (uids
in order per campaign), checked per projector against what each applied (`fault_tracked`):
lost, applied twice, order violations, all zero.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import pytest
from harness import (
    FAST,
    Fleet,
    Generator,
    campaigns,
    finish,
    kill_at_random,
    scaled,
    wait_drained,
)

from helpers import wait_for
from outbox import Settings, db
from outbox.projection.sweep import catch_ups

pytestmark = pytest.mark.timeout(900)
WORKERS = ("w1", "w2", "w3")


async def _applied(pool: db.Pool, projector: str, campaign_ids: Sequence[str]) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM fault_tracked WHERE projector = $1 AND campaign_id = ANY ($2)",
            projector,
            list(campaign_ids),
        )
    )


async def test_one_projector_failing_under_sigkills_while_the_others_run(
    pool: db.Pool, dsn: str, fleet: Fleet
) -> None:
    fleet.app = "faults_app:tracks_app"
    fleet.env |= FAST | {
        "OUTBOX_MAX_ATTEMPTS": "1000",  # failing for the whole run, never dead
        "OUTBOX_BACKOFF_BASE": "0.05",
        "OUTBOX_BACKOFF_CAP": "0.2",
    }
    names = campaigns("tracks", 12)
    sick = names[:3]
    await pool.executemany("INSERT INTO fault_sick VALUES ($1)", [(c,) for c in sick])
    for worker in WORKERS:
        fleet.start(worker, "--concurrency", "2")
    generator = Generator(pool, Settings(dsn=dsn), names, pause=0.05)
    kills = scaled(30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(generator.run)
        await kill_at_random(fleet, WORKERS, random.Random(24), kills)
        generator.stop()
    owed = sum(len(generator.expected[c]) for c in sick)

    async def ledger_level() -> bool:  # the healthy projectors went on past flaky's failures
        return await _applied(pool, "ledger", sick) == owed

    await wait_for(ledger_level, within=120)
    assert await _applied(pool, "flaky", sick) == 0
    held = await pool.fetch(
        "SELECT DISTINCT campaign_id FROM outbox.projection_holds WHERE projector = 'flaky'"
    )
    assert sorted(r["campaign_id"] for r in held) == sick
    await pool.execute("DELETE FROM fault_sick")  # fixed: it goes on from its checkpoints

    async def flaky_level() -> bool:
        return await _applied(pool, "flaky", sick) == owed

    await wait_for(flaky_level, within=120)
    await finish(
        "one_projector_failing",
        pool,
        fleet,
        generator,
        faults=kills,
        projectors=("ledger", "flaky"),
        notes=f"flaky held on {len(sick)} of {len(names)} campaigns",
    )


async def test_a_projector_catching_up_under_sigkills(
    pool: db.Pool, dsn: str, fleet: Fleet
) -> None:
    fleet.env |= FAST
    settings = Settings(dsn=dsn)
    names = campaigns("late", 12)
    for worker in WORKERS[:2]:
        fleet.start(worker, "--concurrency", "2")
    # History: every campaign, applied by `witness` alone.
    generator = Generator(pool, settings, names, pause=0.005)
    await generator.run(appends=60)
    await wait_drained(pool)
    # A rolling deploy of `late` (start="beginning"), four campaigns dormant from now on.
    fleet.app = "faults_app:catch_up_app"
    fleet.start("w3", "--concurrency", "2")
    for worker in WORKERS[:2]:
        fleet.kill(worker)
        fleet.start(worker, "--concurrency", "2")
    live = Generator(pool, settings, names[:8], pause=0.05, key_prefix="live-")
    live.expected = generator.expected
    kills = scaled(20)
    async with anyio.create_task_group() as tg:
        tg.start_soon(live.run)
        await kill_at_random(fleet, WORKERS, random.Random(25), kills)
        live.stop()

    async def caught_up() -> bool:
        found = {c.projector: c for c in await catch_ups(pool)}
        return "late" in found and not found["late"].catching_up

    await wait_for(caught_up, within=180)
    await finish(
        "catching_up",
        pool,
        fleet,
        generator,
        faults=kills,
        projectors=("late",),
        notes=f"{len(names) - 8} of {len(names)} campaigns dormant",
    )


async def test_two_worker_groups_under_sigkills(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    """S35: `witness` served by the default group (w1, w2), `ledger` by group `fast` (w3, w4),
    each from its own queue, while workers of both are killed at random."""
    fleet.env |= FAST
    names = campaigns("groups", 12)
    for worker in WORKERS[:2]:
        fleet.start(worker, "--concurrency", "2")
    for worker in ("w3", "w4"):
        fleet.groups[worker] = ("faults_app:group_app", "fast")
        fleet.start(worker, "--concurrency", "2")
    generator = Generator(pool, Settings(dsn=dsn), names, pause=0.02)
    kills = scaled(30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(generator.run)
        await kill_at_random(fleet, (*WORKERS[:2], "w3", "w4"), random.Random(35), kills)
        generator.stop()

    async def group_drained() -> bool:  # its queue: the holds the appends wrote for `ledger`
        owed = "SELECT count(*) FROM outbox.projection_holds WHERE projector = 'ledger'"
        return not await pool.fetchval(owed)

    await wait_for(group_drained, within=180)
    await finish(
        "worker_groups",
        pool,
        fleet,
        generator,
        faults=kills,
        projectors=("ledger",),
        notes="witness in the default group, ledger in group fast",
    )
