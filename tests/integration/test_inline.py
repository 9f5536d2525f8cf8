"""Inline apply (S5): the fast path inside the append's transaction."""

from __future__ import annotations

import pytest
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install

from outbox import Event, Outbox, Settings, ValidationError, append, db
from outbox.worker.batch import Worker


def inline_app(settings: Settings) -> Outbox:
    return build_app(Outbox(settings.replace(inline_apply=True)))


async def rows(pool: db.Pool) -> list[tuple[str, int, str, int, str | None]]:
    return [
        (r["campaign_id"], r["seq"], r["status"], r["attempt_count"], r["last_error"])
        for r in await pool.fetch(
            "SELECT campaign_id, seq, status, attempt_count, last_error "
            "FROM outbox.projection_apply_outbox ORDER BY 1, 2"
        )
    ]


async def test_inline_success_leaves_no_row(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    app = inline_app(settings)
    result = await app.append(
        pool,
        "c",
        [Event(c.CHARACTER_JOINED, {"character": "Ada"}), Event(c.DICE_ROLLED, {"value": 6})],
    )
    assert result.seqs == range(1, 3)
    assert await rows(pool) == []
    assert await pool.fetchval("SELECT character FROM demo_roster") == "Ada"
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 6
    # The settings flag can be overridden per call.
    await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": 1})], apply_inline=False)
    assert await rows(pool) == [("c", 3, "pending", 0, None)]


async def test_inline_failure_commits_the_append_and_records_attempt_1(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = inline_app(settings)
    await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": 2}), Event(c.DICE_CURSED, {})])
    assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") == 2
    (first, cursed) = await rows(pool)
    assert first == ("c", 1, "pending", 0, None)  # rolled back with the savepoint
    assert cursed[:4] == ("c", 2, "failed", 1)
    assert cursed[4] is not None
    assert cursed[4].startswith("projector 'curse': CursedDice")
    assert await pool.fetchval("SELECT count(*) FROM demo_dice_totals") == 0


async def test_inline_is_skipped_behind_an_outstanding_earlier_row(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "c", [Event(c.DICE_ROLLED, {"value": 1})], settings=settings)  # queued
    app = inline_app(settings)
    await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": 2})])
    assert await rows(pool) == [("c", 1, "pending", 0, None), ("c", 2, "pending", 0, None)]
    assert await pool.fetchval("SELECT count(*) FROM demo_dice_totals") == 0
    # The worker takes both, in order, once.
    await Worker(app, pool).drain()
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 3


async def test_inline_and_worker_together_apply_each_event_once(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = inline_app(settings)
    # Inline, queued (inline off), and inline skipped behind a queued row, in three campaigns.
    for value in range(1, 13):
        await app.append(
            pool,
            f"c-{value % 3}",
            [Event(c.DICE_ROLLED, {"value": value})],
            apply_inline=value % 4 != 0,
        )
    await Worker(app, pool).drain()
    assert await rows(pool) == []
    rolls = await pool.fetchval(
        "SELECT count(*) FROM outbox.event_journal WHERE event_type = $1", c.DICE_ROLLED
    )
    assert await pool.fetchval("SELECT sum(rolls) FROM demo_dice_totals") == rolls


async def test_inline_with_a_duplicate_key_applies_nothing(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = inline_app(settings)
    await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": 4})], idempotency_key="k")
    again = await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": 4})], idempotency_key="k")
    assert again.duplicate
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 4


async def test_module_level_append_refuses_inline_without_an_app(
    pool: db.Pool, settings: Settings
) -> None:
    with pytest.raises(ValidationError, match=r"app\.append"):
        await append(pool, "c", [Event("t", {})], settings=settings, apply_inline=True)
