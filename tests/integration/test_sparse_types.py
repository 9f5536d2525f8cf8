"""The catch-up engine on a projector of sparse types (S30): its steps are counted in its own
events, which it reads by the journal's type index, not in the journal's positions. Oracle: the
sums the test's generator appended per campaign, never what the engine saw."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from worker_apps import tally

from helpers import sums
from outbox import Event, Settings, append, db
from outbox.append.journal import Q
from outbox.projection.app import Outbox
from outbox.projection.build import build
from outbox.testing.localcitus import CitusCluster

# The journal: (campaign, events, one `add` in every `every` events), in key order; the dense
# campaigns after the sparse ones make a step that spans many positions meet dense ranges.
LAYOUT = [("a-sparse", 400, 40), ("b-sparse", 300, 50), ("c-dense", 60, 1), ("d-sparse", 200, 25)]


async def journal_of(pool: db.Pool, settings: Settings, rng: random.Random) -> Counter[str]:
    """Append `LAYOUT` in chunks; each campaign's sum of `add` events."""
    expected: Counter[str] = Counter()
    for campaign, count, every in LAYOUT:
        events = []
        for i in range(count):
            if i % every == every - 1:
                n = rng.randint(1, 9)
                expected[campaign] += n
                events.append(Event("add", {"n": n}))
            else:
                events.append(Event("noise", {"i": i}))
        for at in range(0, count, 50):
            await append(pool, campaign, events[at : at + 50], settings=settings)
    return expected


@pytest.mark.usefixtures("table", "small_steps")
async def test_a_sparse_projector_steps_by_its_own_events(pool: db.Pool, dsn: str) -> None:
    # Journaled with no work rows: no live path for the engine to yield to (`LivePace`).
    expected = await journal_of(pool, Settings(dsn=dsn, enabled=False), random.Random(60))
    settings = Settings(dsn=dsn)
    app = Outbox(settings)
    app.projector("tally", events=["add"], batch=True, start="beginning")(tally)
    projector = app.registry.projectors["tally"]

    seen: list[int] = []  # the events done after each step (and each bucket's end)
    built = await build(pool, projector, connections=1, progress=lambda p: seen.append(p.events))

    assert built.complete
    assert await sums(pool, "tally") == expected
    assert built.progress.events == sum(count // every for _, count, every in LAYOUT)
    # No step applied more than its budget (small_steps: 9 events), the dense campaign included.
    steps = [b - a for a, b in zip([0, *seen], seen, strict=False) if b > a]
    assert max(steps) <= 9, steps
    # Counted in positions, 9 a step, the 960 positions would take 107 steps or more; counted in
    # the projector's events (84), a step spans up to SPREAD times its budget.
    assert len(steps) < 20, steps


async def test_the_engine_reads_a_projectors_events_by_the_type_index(
    pool: db.Pool, dsn: str, citus: CitusCluster | None
) -> None:
    if citus is not None:
        pytest.skip("a plan on one server: Citus plans each shard's statement itself")
    settings = Settings(dsn=dsn)
    await pool.execute("ANALYZE outbox.event_journal")  # analyzed while empty
    await journal_of(pool, settings, random.Random(61))
    bucket = await pool.fetchval("SELECT outbox.outbox_bucket('a-sparse')")
    plans: list[str] = []

    def heard(_: object, message: object) -> None:
        plans.append(message.message)  # type: ignore[attr-defined]

    async with pool.acquire() as conn:
        conn.add_log_listener(heard)
        # The plans of the statements inside the functions, as the server runs them, sent here.
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute(AUTO_EXPLAIN)
        # A long-lived session whose cached plans went generic: the reads plan for their
        # arguments all the same.
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        for query in (Q.load_typed_ranges, Q.count_typed_ranges) * 7:
            await conn.fetch(query, bucket, ["a-sparse"], [1], [400], ["add"])
        conn.remove_log_listener(heard)
    journal = [p for p in plans if "on event_journal" in p]
    assert len(journal) == 14
    assert all("event_journal_type_idx" in p for p in journal), journal[-1]


AUTO_EXPLAIN = """
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice
"""
