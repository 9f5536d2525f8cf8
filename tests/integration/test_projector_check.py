"""The projector check (`outbox.testing.check`): a correct projector passes every scenario, and
each classic bug that passes a unit test is caught by the scenario that breaks it, naming it
with both read models. The oracle is the read model one event per batch leaves, which for
these projectors is the generator's own sums (checked too)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from outbox import Event, EventBatch, Settings, StoredEvent, db
from outbox.errors import ConfigError
from outbox.projection.app import Outbox
from outbox.projection.registry import ResetFn
from outbox.testing import ProjectorCheckFailed, check_projector, projector_scenario

TABLES = """
CREATE TABLE IF NOT EXISTS check_totals (campaign_id text PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE IF NOT EXISTS check_counts (campaign_id text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS check_last (campaign_id text PRIMARY KEY, seq bigint NOT NULL,
                                       at timestamptz);
"""
ADD_TOTAL = """
INSERT INTO check_totals AS t (campaign_id, total) VALUES ($1, $2)
ON CONFLICT (campaign_id) DO UPDATE SET total = t.total + excluded.total
"""
ADD_COUNT = """
INSERT INTO check_counts AS t (campaign_id, n) VALUES ($1, 1)
ON CONFLICT (campaign_id) DO UPDATE SET n = t.n + 1
"""
SET_LAST = """
INSERT INTO check_last AS t (campaign_id, seq, at) VALUES ($1, $2, $3)
ON CONFLICT (campaign_id) DO UPDATE SET seq = excluded.seq, at = excluded.at
"""


async def setup(conn: db.Connection) -> None:
    await conn.execute(TABLES)
    await conn.execute("TRUNCATE check_totals, check_counts, check_last")


async def read(conn: db.Connection) -> dict[str, Any]:
    totals = {r[0]: r[1] for r in await conn.fetch("SELECT * FROM check_totals")}
    counts = {r[0]: r[1] for r in await conn.fetch("SELECT * FROM check_counts")}
    last = {r[0]: (r[1], r[2]) for r in await conn.fetch("SELECT * FROM check_last")}
    return {"totals": totals, "counts": counts, "last": last}


def history(seed: int = 62) -> tuple[list[tuple[str, Event]], Counter[str]]:
    """Events over five campaigns, some of a type no projector here takes; the sums."""
    rng = random.Random(seed)
    events: list[tuple[str, Event]] = []
    sums: Counter[str] = Counter()
    for _ in range(40):
        campaign = f"c{rng.randrange(5)}"
        if rng.random() < 0.2:
            events.append((campaign, Event("noted", {})))
            continue
        n = rng.randint(1, 9)
        events.append((campaign, Event("added", {"n": n})))
        sums[campaign] += n
    return events, sums


async def reset(tx: db.Connection, campaign_id: str) -> None:
    for table in ("check_totals", "check_counts", "check_last"):
        await tx.execute(f"DELETE FROM {table} WHERE campaign_id = $1", campaign_id)


def good_app(reset: ResetFn = reset) -> Outbox:
    """Totals and counts per campaign, the last seq each saw: right (with a right `reset`)."""
    app = Outbox(Settings())

    @app.projector("totals", events=["added"], batch=True, reset=reset)
    async def totals(tx: db.Connection, events: EventBatch) -> None:
        last: dict[str, int] = {}
        for campaign, seq, payload in zip(
            events.campaign_ids, events.seqs, events.payloads, strict=True
        ):
            await tx.execute(ADD_TOTAL, campaign, payload["n"])
            await tx.execute(ADD_COUNT, campaign)
            last[campaign] = seq
        for campaign, seq in last.items():
            await tx.execute(SET_LAST, campaign, seq, None)

    return app


async def test_a_right_projector_passes_every_scenario(dsn: str, pool: db.Pool) -> None:
    events, sums = history()
    run = await check_projector(good_app(), "totals", events, setup=setup, read=read, dsn=dsn)
    assert run.scenarios == [
        "one event per batch",
        "all in one batch",
        "random batching 1 (seed 0)",
        "random batching 2 (seed 0)",
        "random batching 3 (seed 0)",
        "a failure after its statements, retried",
        "rebuilt through its reset hook",
        "caught up as a new projector",
    ]
    assert run.skipped == {}
    assert run.read_model["totals"] == dict(sums)  # type: ignore[index]
    # It leaves nothing behind: its install's schema is gone.
    assert (
        await pool.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'outbox_check_%'")
        == 0
    )


async def test_a_batch_projector_taking_the_batchs_last_seq_for_every_campaign_is_caught(
    dsn: str,
) -> None:
    app = Outbox(Settings())

    @app.projector("totals", events=["added"], batch=True, reset=reset)
    async def totals(tx: db.Connection, events: EventBatch) -> None:
        for campaign, payload in zip(events.campaign_ids, events.payloads, strict=True):
            await tx.execute(ADD_TOTAL, campaign, payload["n"])
            await tx.execute(SET_LAST, campaign, events.seqs[-1], None)  # the bug

    events, _ = history()
    with pytest.raises(ProjectorCheckFailed) as caught:
        await check_projector(app, "totals", events, setup=setup, read=read, dsn=dsn)
    assert caught.value.scenario == "all in one batch"
    assert caught.value.expected != caught.value.got
    assert "differs from one event per batch's" in str(caught.value)


async def test_a_reset_hook_that_forgets_a_table_is_caught(dsn: str) -> None:
    async def forgetful(tx: db.Connection, campaign_id: str) -> None:
        await tx.execute("DELETE FROM check_totals WHERE campaign_id = $1", campaign_id)
        await tx.execute("DELETE FROM check_last WHERE campaign_id = $1", campaign_id)

    app = good_app(forgetful)
    events, _ = history()
    with pytest.raises(ProjectorCheckFailed) as caught:
        await check_projector(app, "totals", events, setup=setup, read=read, dsn=dsn)
    assert caught.value.scenario == "rebuilt through its reset hook"
    assert caught.value.got["counts"] != caught.value.expected["counts"]  # type: ignore[index]


async def test_the_clock_in_the_read_model_is_caught(dsn: str) -> None:
    app = Outbox(Settings())

    @app.projector("totals", events=["added"])
    async def totals(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(ADD_TOTAL, event.campaign_id, event.payload["n"])
        await tx.execute(
            "INSERT INTO check_last AS t VALUES ($1, $2, now()) ON CONFLICT (campaign_id) "
            "DO UPDATE SET seq = excluded.seq, at = excluded.at",
            event.campaign_id,
            event.seq,
        )

    events, _ = history()
    with pytest.raises(ProjectorCheckFailed) as caught:
        await check_projector(app, "totals", events, setup=setup, read=read, dsn=dsn)
    assert caught.value.scenario == "all in one batch"


async def test_state_kept_outside_the_transaction_is_caught_by_the_retry(dsn: str) -> None:
    """A running total cached in the process: a batch rolled back and retried counts twice."""
    app = Outbox(Settings())
    cache: Counter[str] = Counter()

    @app.projector("totals", events=["added"], batch=True)
    async def totals(tx: db.Connection, events: EventBatch) -> None:
        for campaign, payload in zip(events.campaign_ids, events.payloads, strict=True):
            cache[campaign] += payload["n"]
            await tx.execute(
                "INSERT INTO check_totals AS t VALUES ($1, $2) ON CONFLICT (campaign_id) "
                "DO UPDATE SET total = excluded.total",
                campaign,
                cache[campaign],
            )

    async def setup_and_forget(conn: db.Connection) -> None:
        cache.clear()  # each scenario starts from an empty process too
        await setup(conn)

    events, _ = history()
    with pytest.raises(ProjectorCheckFailed) as caught:
        await check_projector(app, "totals", events, setup=setup_and_forget, read=read, dsn=dsn)
    assert caught.value.scenario == "a failure after its statements, retried"


async def test_scenarios_a_projector_cannot_take_are_said_and_bad_names_refused(dsn: str) -> None:
    app = Outbox(Settings())

    @app.projector("totals", events=["added"], ordered=False)
    async def totals(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(ADD_TOTAL, event.campaign_id, event.payload["n"])

    events, _ = history()
    run = await check_projector(app, "totals", events, setup=setup, read=read, dsn=dsn)
    assert run.skipped == {
        "rebuilt through its reset hook": "it has no reset hook",
        "caught up as a new projector": (
            "it has no guard (ordered, or idempotent markers) to catch up under"
        ),
    }
    with pytest.raises(ConfigError, match="registers no projector 'total'"):
        await check_projector(app, "total", events, setup=setup, read=read, dsn=dsn)


async def test_given_when_then(dsn: str) -> None:
    async with projector_scenario(good_app(), "totals", setup=setup, dsn=dsn) as s:
        await s.given(("c1", Event("added", {"n": 2})), ("c2", Event("added", {"n": 1})))
        await s.when(("c1", Event("added", {"n": 3})), ("c1", Event("noted", {})))
        model = await s.then(read)
    assert model["totals"] == {"c1": 5, "c2": 1}
    assert model["last"] == {"c1": (2, None), "c2": (1, None)}
