"""An ordered projector deployed onto campaigns with history catches up from the journal, in
the worker, with no failure, no dead row and no operator (S17). Oracles: the sums each test's
own generator appended, per projector."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from outbox import Event, Settings, append, db
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.heal import HEAL_EVENTS
from outbox.worker.batch import Worker
from outbox.worker.runtime import drain_now

SUMS = (
    "CREATE TABLE sums (projector text, campaign_id text, n bigint, "
    "PRIMARY KEY (projector, campaign_id))"
)


def app_with(settings: Settings, *names: str) -> Outbox:
    """Ordered batch projectors, each adding its events' `n` into `sums` under its name."""
    app = Outbox(settings)
    for name in names:

        async def add(tx: db.Connection, events: Sequence[StoredEvent], name: str = name) -> None:
            await tx.execute(
                "INSERT INTO sums SELECT $1, c, sum(n) FROM unnest($2::text[], $3::bigint[]) "
                "AS e(c, n) GROUP BY c ON CONFLICT (projector, campaign_id) "
                "DO UPDATE SET n = sums.n + excluded.n",
                name,
                [e.campaign_id for e in events],
                [e.payload["n"] for e in events],
            )

        app.projector(name, events=["add"], batch=True)(add)
    return app


async def sums(pool: db.Pool, projector: str) -> Counter[str]:
    rows = await pool.fetch("SELECT campaign_id, n FROM sums WHERE projector = $1", projector)
    return Counter({r["campaign_id"]: r["n"] for r in rows})


async def add_events(
    pool: db.Pool, settings: Settings, expected: Counter[str], campaign: str, values: list[int]
) -> None:
    await append(pool, campaign, [Event("add", {"n": v}) for v in values], settings=settings)
    expected[campaign] += sum(values)


async def failed_rows(pool: db.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM outbox.projection_apply_outbox WHERE attempt_count > 0"
        )
    )


@pytest.fixture(autouse=True)
async def sums_table(pool: db.Pool) -> None:
    await pool.execute(SUMS)


async def stats_deployed(
    pool: db.Pool, dsn: str, history: dict[str, list[int]]
) -> tuple[Settings, Counter[str], Outbox]:
    """Each campaign's `history` appended and applied by `roster`; then `stats` deployed beside
    it: the settings, the oracle so far, and the new app."""
    settings = Settings(dsn=dsn)
    expected: Counter[str] = Counter()
    for cid, values in history.items():
        await add_events(pool, settings, expected, cid, values)
    await drain_now(app_with(settings, "roster"), pool)
    return settings, expected, app_with(settings, "roster", "stats")


async def test_a_projector_deployed_onto_live_campaigns_catches_up_with_no_failure(
    pool: db.Pool, dsn: str
) -> None:
    campaigns = [f"live-{i:02d}" for i in range(50)]
    history = {cid: [i % 7 + 1, 2, 3, 4] for i, cid in enumerate(campaigns)}
    settings, expected, app = await stats_deployed(pool, dsn, history)
    # `stats` is deployed; every campaign then gets one more event.
    for cid in campaigns:
        await add_events(pool, settings, expected, cid, [10])
    counts = await drain_now(app, pool)
    assert (counts.failed, counts.dead) == (0, 0)
    assert await failed_rows(pool) == 0
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "stats") == expected  # the history too, once
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0


async def test_history_longer_than_a_batch_takes_is_caught_up_over_several_batches(
    pool: db.Pool, dsn: str
) -> None:
    long = [i % 5 + 1 for i in range(HEAL_EVENTS * 2 + 500)]
    settings, expected, app = await stats_deployed(pool, dsn, {"long": long})
    await add_events(pool, settings, expected, "long", [7])
    worker = Worker(app, pool)
    first = await worker.run_once()
    # The batch brought `stats` as far as a batch takes and left the new row due, charged
    # nothing; `roster` has not seen the new event yet (it waits for `stats`).
    assert (first.behind, first.applied, first.failed) == (1, 0, 0)
    assert (
        await pool.fetchval(
            "SELECT applied_seq FROM outbox.projection_checkpoints WHERE projector = 'stats'"
        )
        == HEAL_EVENTS
    )
    assert await failed_rows(pool) == 0
    counts = await drain_now(app, pool)
    assert (counts.failed, counts.dead) == (0, 0)
    assert await sums(pool, "stats") == expected
    assert await sums(pool, "roster") == expected


async def test_an_inline_append_leaves_a_campaign_with_a_projector_behind_to_the_worker(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, inline_apply=True)
    expected: Counter[str] = Counter()
    old = app_with(settings, "roster")
    await old.append(pool, "c", [Event("add", {"n": 2})] * 3)
    expected["c"] = 6
    assert await sums(pool, "roster") == expected  # applied inline
    app = app_with(settings, "roster", "stats")
    await app.append(pool, "c", [Event("add", {"n": 5})])
    expected["c"] += 5
    # Not applied inline (it would need the campaign's history first), and charged nothing.
    row = await pool.fetchrow("SELECT seq, attempt_count FROM outbox.projection_apply_outbox")
    assert row is not None
    assert (row["seq"], row["attempt_count"]) == (4, 0)
    counts = await drain_now(app, pool)
    assert (counts.failed, counts.dead) == (0, 0)
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "stats") == expected
