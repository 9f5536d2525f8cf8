"""Worker groups (S35): each recorded projector is served by one group of workers; a projector
of a group other than the default one has its own queue (its holds, written by the append), so
the default group's workers neither hold nor count anything on its behalf, and each group's
projectors apply at their own pace. Oracles: the sums each test's generator appended, per
projector, never what a worker saw."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from helpers import ADD, SUMS, sums
from outbox import Event, Settings, append, db
from outbox.errors import ConfigError
from outbox.model import StoredEvent
from outbox.ops.requeue import requeue_dead
from outbox.projection.app import Outbox
from outbox.projection.definition import DefinitionDrift
from outbox.projection.known import list_known, record
from outbox.worker.batch import Worker
from outbox.worker.runtime import build_service

GROUP = "fast"


def adding(settings: Settings, name: str, *, failing: set[str] | None = None, **kw: Any) -> Outbox:
    """An app whose one projector `name` adds each `add` event's n into `sums` (raising on the
    campaigns in `failing`, for as long as they are listed)."""
    app = Outbox(settings)
    broken = failing if failing is not None else set()

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        if event.campaign_id in broken:
            raise RuntimeError(f"{name} cannot take {event.campaign_id}")
        await tx.execute(ADD, name, event.campaign_id, event.payload["n"])

    app.projector(name, events=["add"], **kw)(add)  # ordered, from the beginning by default
    return app


async def append_adds(
    pool: db.Pool, count: int, campaigns: int, rng: random.Random
) -> Counter[str]:
    """`count` one-event appends over `campaigns` campaigns; the sums appended, per campaign."""
    appended: Counter[str] = Counter()
    for _ in range(count):
        cid, n = f"c{rng.randrange(campaigns)}", rng.randrange(1, 100)
        await append(pool, cid, [Event("add", {"n": n})])
        appended[cid] += n
    return appended


async def holds_of(pool: db.Pool, projector: str) -> list[db.Record]:
    return await pool.fetch(
        "SELECT campaign_id, seq, status, attempt_count, from_seq FROM outbox.projection_holds "
        "WHERE projector = $1 ORDER BY campaign_id",
        projector,
    )


async def two_groups(pool: db.Pool, dsn: str) -> tuple[Outbox, Outbox]:
    """`roster` served by the default group, `stats` by group `fast`, both recorded."""
    await pool.execute(SUMS)
    default = adding(Settings(dsn=dsn), "roster")
    grouped = adding(Settings(dsn=dsn, group=GROUP), "stats")
    await record(pool, default.registry, "w1")
    await record(pool, grouped.registry, "w2", GROUP)
    return default, grouped


async def test_each_group_applies_its_own_projectors_once_and_holds_nothing_for_the_other(
    pool: db.Pool, dsn: str
) -> None:
    default, grouped = await two_groups(pool, dsn)
    known = {k.projector: k.group for k in await list_known(pool)}
    assert known == {"roster": "default", "stats": GROUP}
    rng = random.Random(35)
    appended = await append_adds(pool, 120, 12, rng)

    counts = await Worker(default, pool).drain()
    assert await sums(pool, "roster") == appended
    assert await sums(pool, "stats") == Counter()
    # Nothing counted on the other group's behalf, and no hold of the default group's: the
    # group's holds are the append's, one per campaign, at seq 0, from the first event owed.
    assert (counts.paused, counts.elsewhere, counts.held) == (0, 0, 0)
    assert await holds_of(pool, "roster") == []
    holds = await holds_of(pool, "stats")
    assert sorted(h["campaign_id"] for h in holds) == sorted(appended)
    assert {(h["seq"], h["status"]) for h in holds} == {(0, "pending")}
    firsts = {
        r["campaign_id"]: r["seq"]
        for r in await pool.fetch(
            "SELECT campaign_id, min(seq) AS seq FROM outbox.event_journal GROUP BY 1"
        )
    }
    assert {h["campaign_id"]: h["from_seq"] for h in holds} == firsts

    assert (await Worker(grouped, pool).drain()).claimed == len(appended)
    assert await sums(pool, "stats") == appended
    assert await holds_of(pool, "stats") == []
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0

    # Both groups at once, while appends flow: each exact, nothing left behind.
    more: Counter[str] = Counter()
    done = anyio.Event()

    async def produce() -> None:
        more.update(await append_adds(pool, 200, 12, rng))
        done.set()

    async def serve(app: Outbox) -> None:
        worker = Worker(app, pool)
        while not done.is_set():
            await worker.drain()
            await anyio.lowlevel.checkpoint()
        await worker.drain()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(produce)
        tasks.start_soon(serve, default)
        tasks.start_soon(serve, grouped)
    await Worker(grouped, pool).drain()
    await Worker(default, pool).drain()
    assert await sums(pool, "roster") == appended + more
    assert await sums(pool, "stats") == appended + more
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0


async def test_a_group_projector_backs_off_dead_letters_and_is_requeued_alone(
    pool: db.Pool, dsn: str
) -> None:
    await pool.execute(SUMS)
    failing = {"c1"}
    default = adding(Settings(dsn=dsn), "roster")
    grouped = adding(
        Settings(dsn=dsn, group=GROUP, max_attempts=2, backoff_base=60, backoff_cap=60),
        "stats",
        failing=failing,
    )
    await record(pool, default.registry, "w1")
    await record(pool, grouped.registry, "w2", GROUP)
    appended = await append_adds(pool, 40, 3, random.Random(7))
    await Worker(default, pool).drain()
    assert await sums(pool, "roster") == appended

    clock = datetime.now(UTC)
    worker = Worker(grouped, pool, now=lambda: clock)
    first = await worker.drain()
    assert first.failed == 1
    assert await sums(pool, "stats") == Counter({k: v for k, v in appended.items() if k != "c1"})
    (hold,) = await holds_of(pool, "stats")
    start = await pool.fetchval(
        "SELECT min(seq) FROM outbox.event_journal WHERE campaign_id = 'c1'"
    )
    assert (hold["campaign_id"], hold["seq"], hold["status"]) == ("c1", 0, "failed")
    assert (hold["attempt_count"], hold["from_seq"]) == (1, start)
    clock += timedelta(minutes=2)
    assert (await worker.drain()).dead == 1
    (hold,) = await holds_of(pool, "stats")
    assert (hold["status"], hold["attempt_count"]) == ("dead", 2)
    clock += timedelta(hours=1)
    assert (await worker.drain()).claimed == 0  # dead: an operator's

    failing.clear()
    requeued = await requeue_dead(pool, limit=10, projector="stats", reason="fixed", actor="test")
    assert requeued.requeued == 1
    await Worker(grouped, pool).drain()
    assert await sums(pool, "stats") == appended
    assert await holds_of(pool, "stats") == []
    assert await sums(pool, "roster") == appended  # applied once, never held


@pytest.mark.parametrize("start", ["now", "beginning"])
async def test_a_group_projector_deployed_onto_history_starts_where_it_says(
    pool: db.Pool, dsn: str, start: str
) -> None:
    """`now`: at the first event appended after it was recorded, on each campaign (its hold's
    `from_seq`); `beginning`: the engine, run by the group's worker, walks every campaign."""
    await pool.execute(SUMS)
    default = adding(Settings(dsn=dsn), "roster")
    await record(pool, default.registry, "w1")
    rng = random.Random(3)
    before = await append_adds(pool, 30, 5, rng)
    grouped = adding(Settings(dsn=dsn, group=GROUP), "stats", start=start)
    await record(pool, grouped.registry, "w2", GROUP)
    after = await append_adds(pool, 30, 5, rng)
    await Worker(grouped, pool).drain()
    await Worker(default, pool).drain()
    assert await sums(pool, "stats") == (after if start == "now" else before + after)
    assert await sums(pool, "roster") == before + after
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0


async def test_a_worker_in_another_group_than_its_projectors_record_is_refused(
    pool: db.Pool, dsn: str
) -> None:
    await two_groups(pool, dsn)
    moved = adding(Settings(dsn=dsn, group=GROUP), "roster")
    with pytest.raises(
        DefinitionDrift, match=r"'roster' differs from its record \(group default -> fast\)"
    ):
        await record(pool, moved.registry, "w3", GROUP)
    # Nothing written: the record is as it was.
    assert {k.projector: k.group for k in await list_known(pool)} == {
        "roster": "default",
        "stats": GROUP,
    }
    unordered = adding(Settings(dsn=dsn, group=GROUP), "loose", ordered=False, idempotent=True)
    with pytest.raises(ConfigError, match="serves ordered, transactional projectors"):
        unordered.validate()
    with pytest.raises(ConfigError, match="OUTBOX_GROUP"):
        Settings.from_env({"OUTBOX_GROUP": "Not A Name"})


async def test_a_worker_in_a_group_records_its_projectors_there_and_serves_them(
    pool: db.Pool, dsn: str
) -> None:
    await pool.execute(SUMS)
    grouped = adding(Settings(dsn=dsn, group=GROUP), "stats")
    default = adding(Settings(dsn=dsn), "roster")
    await record(pool, default.registry, "w1")
    service = build_service(grouped, pool, until_idle=True)
    await service.run(shutdown_timeout=0)  # records `stats` in the group, nothing due yet
    assert {k.projector: k.group for k in await list_known(pool)}["stats"] == GROUP
    appended = await append_adds(pool, 25, 4, random.Random(1))
    service = build_service(grouped, pool, until_idle=True)
    await service.run(shutdown_timeout=0)
    assert await sums(pool, "stats") == appended
    assert service.totals.applied == sum(1 for _ in range(25))


ADD_SQL = """
CREATE SCHEMA grp;
CREATE FUNCTION grp.add(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.sums
    SELECT 'stats_sql', e ->> 'campaign_id', sum((e -> 'payload' ->> 'n')::bigint)
    FROM jsonb_array_elements(events) AS e GROUP BY 2
    ON CONFLICT (projector, campaign_id) DO UPDATE SET n = sums.n + excluded.n
$$;
"""


async def test_a_group_of_sql_projectors_runs_its_batches_in_one_call(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-call path works per group (S35): the default group's SQL batches beside another
    group's holds, and a named group's SQL batches on its holds; neither runs a batch of the
    worker's own path (`Worker._batch`, which fails the test here)."""
    await pool.execute(SUMS)
    await pool.execute(ADD_SQL)
    default = Outbox(Settings(dsn=dsn))
    default.sql_projector("roster_sql", events=["add"], function="grp.add_roster", start="now")
    await pool.execute(
        ADD_SQL.replace("CREATE SCHEMA grp;", "")
        .replace("grp.add(", "grp.add_roster(")
        .replace("'stats_sql'", "'roster_sql'")
    )
    grouped = Outbox(Settings(dsn=dsn, group=GROUP))
    grouped.sql_projector("stats_sql", events=["add"], function="grp.add", start="now")
    await record(pool, default.registry, "w1")
    await record(pool, grouped.registry, "w2", GROUP)
    appended = await append_adds(pool, 150, 20, random.Random(9))

    async def own_path(*_args: object, **_kw: object) -> None:
        raise AssertionError("a batch of the worker's own path")

    monkeypatch.setattr(Worker, "_batch", own_path)
    await Worker(grouped, pool).drain()
    await Worker(default, pool).drain()
    assert await sums(pool, "stats_sql") == appended
    assert await sums(pool, "roster_sql") == appended
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
