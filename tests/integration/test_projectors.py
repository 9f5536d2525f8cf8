"""Projector dispatch against a real PostgreSQL: checkpoints, markers, ignored and unknown types."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from helpers import is_blocked, session_id, wait_for
from outbox import ConfigError, Settings, db
from outbox.errors import CheckpointGap, UnknownEventType
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.dispatch import ApplyOutcome, apply_event
from outbox.testing.localcitus import CitusCluster


def stored(seq: int, type_: str = "t.happened", campaign: str = "c") -> StoredEvent:
    return StoredEvent(campaign, seq, type_, {"seq": seq}, {}, datetime.now(UTC))


async def noop(tx: db.Connection, event: StoredEvent) -> None:
    return None


def make_app(calls: list[tuple[str, int]], **options: Any) -> Outbox:
    app = Outbox(Settings())

    @app.projector("ordered", events=["t.happened"], **options)
    async def ordered(tx: db.Connection, event: StoredEvent) -> None:
        calls.append(("ordered", event.seq))

    @app.projector("additive", events=["t.happened", "u.happened"], ordered=False, idempotent=True)
    async def additive(tx: db.Connection, event: StoredEvent) -> None:
        calls.append(("additive", event.seq))

    app.ignore(["v.noise"])
    return app


async def test_ordered_projector_applies_in_sequence_and_skips_duplicates(pool: db.Pool) -> None:
    calls: list[tuple[str, int]] = []
    app = make_app(calls)
    async with pool.acquire() as conn:
        for seq in (1, 2, 2, 1, 3):
            async with conn.transaction():
                await apply_event(conn, app.registry, stored(seq))
    assert [s for name, s in calls if name == "ordered"] == [1, 2, 3]
    assert [s for name, s in calls if name == "additive"] == [1, 2, 3]
    assert await pool.fetchval("SELECT applied_seq FROM outbox.projection_checkpoints") == 3
    assert await pool.fetchval("SELECT count(*) FROM outbox.processed_markers") == 3


async def test_redelivery_of_a_fully_applied_event_is_a_duplicate(pool: db.Pool) -> None:
    app = make_app([])
    async with pool.acquire() as conn:
        assert await apply_event(conn, app.registry, stored(1)) is ApplyOutcome.APPLIED
        assert await apply_event(conn, app.registry, stored(1)) is ApplyOutcome.DUPLICATE


async def test_gap_is_detected_for_an_ordered_projector(pool: db.Pool) -> None:
    app = make_app([])
    async with pool.acquire() as conn:
        async with conn.transaction():
            await apply_event(conn, app.registry, stored(1))
        with pytest.raises(CheckpointGap, match=r"at seq 1 .* cannot apply seq 3"):
            async with conn.transaction():
                await apply_event(conn, app.registry, stored(3))
        # A campaign never seen: seq 4 is a gap behind 0.
        with pytest.raises(CheckpointGap, match="at seq 0"):
            async with conn.transaction():
                await apply_event(conn, app.registry, stored(4, campaign="other"))
    # The additive projector ran before the gap was found; its marker rolled back with the rest.
    assert await pool.fetchval("SELECT array_agg(seq) FROM outbox.processed_markers") == [1]
    assert await pool.fetchval(
        "SELECT array_agg(applied_seq) FROM outbox.projection_checkpoints"
    ) == [1]


async def test_a_failing_projector_rolls_back_its_guards(pool: db.Pool) -> None:
    app = Outbox(Settings())

    @app.projector("a_first", events=["t.happened"])
    async def first(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("CREATE TABLE IF NOT EXISTS side (seq bigint)")
        await tx.execute("INSERT INTO side VALUES ($1)", event.seq)

    @app.projector("b_broken", events=["t.happened"], ordered=False, idempotent=True)
    async def broken(tx: db.Connection, event: StoredEvent) -> None:
        raise RuntimeError("projection bug")

    async with pool.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await apply_event(conn, app.registry, stored(1))
    assert await pool.fetchval("SELECT to_regclass('side') IS NULL")
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_checkpoints") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.processed_markers") == 0


async def test_unknown_type_fails_and_ignored_type_completes(pool: db.Pool) -> None:
    app = make_app([])
    async with pool.acquire() as conn:
        with pytest.raises(UnknownEventType, match=r"w\.unheard"):
            await apply_event(conn, app.registry, stored(1, "w.unheard"), unsubscribed="retry")
        unheard = await apply_event(conn, app.registry, stored(1, "w.unheard"))
        assert unheard is ApplyOutcome.UNSUBSCRIBED  # the default: skip
        assert await apply_event(conn, app.registry, stored(1, "v.noise")) is ApplyOutcome.IGNORED


def test_registration_errors_are_config_errors() -> None:
    app = make_app([])
    with pytest.raises(ConfigError, match="twice"):
        app.projector("ordered", events=["x"])(noop)
    with pytest.raises(ConfigError, match="no event type"):
        app.projector("empty", events=[])(noop)
    with pytest.raises(ConfigError, match="not a string"):
        app.projector("str", events="t.happened")
    with pytest.raises(ConfigError, match="ignore"):
        app.ignore(["t.happened"])


@pytest.mark.parametrize(
    ("ordering", "dead_policy", "message"),
    [("none", "block", "OUTBOX_ORDERING=none"), ("campaign", "park", "OUTBOX_DEAD_POLICY=park")],
)
def test_contradictory_settings_are_refused_at_startup(
    ordering: str, dead_policy: str, message: str
) -> None:
    app = make_app([])
    app.settings = Settings(ordering=ordering, dead_policy=dead_policy)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        app.validate()
    unordered = Outbox(Settings(ordering="none", dead_policy="park"))
    unordered.projector("sum", events=["x"], ordered=False, idempotent=True)(noop)
    unordered.validate()


async def test_ordered_projector_of_a_subset_of_types_sees_no_gap(pool: db.Pool) -> None:
    """Every event passes every ordered projector's checkpoint, subscribed or not (S17)."""
    app = Outbox(Settings())
    seen: list[int] = []

    @app.projector("only_u", events=["u.happened"])
    async def only_u(tx: db.Connection, event: StoredEvent) -> None:
        seen.append(event.seq)

    @app.projector("only_t", events=["t.happened"])
    async def only_t(tx: db.Connection, event: StoredEvent) -> None:
        return None

    app.ignore(["v.noise"])
    stream = ["t.happened", "u.happened", "v.noise", "t.happened", "u.happened"]
    async with pool.acquire() as conn:
        for seq, type_ in enumerate(stream, start=1):
            async with conn.transaction():
                await apply_event(conn, app.registry, stored(seq, type_))
        # A redelivery of seq 2 is a duplicate for everyone.
        assert await apply_event(conn, app.registry, stored(2, "u.happened")) is (
            ApplyOutcome.DUPLICATE
        )
    assert seen == [2, 5]
    rows = await pool.fetch("SELECT projector, applied_seq FROM outbox.projection_checkpoints")
    assert {r["projector"]: r["applied_seq"] for r in rows} == {"only_u": 5, "only_t": 5}


async def test_two_first_applications_of_a_campaign_apply_it_once(
    pool: db.Pool, citus: CitusCluster | None
) -> None:
    """With no checkpoint row yet, a second applier outside the queue (a tool, a replay) waits
    for the first instead of reading "missing" as 0 and applying the event again."""
    app = Outbox(Settings())

    @app.projector("tally", events=["t.happened"])
    async def tally(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("UPDATE tally SET n = n + 1")

    await pool.execute("CREATE TABLE tally (n int NOT NULL); INSERT INTO tally VALUES (0)")
    event = stored(1)
    async with pool.acquire() as first, pool.acquire() as second:
        tx = first.transaction()
        await tx.start()
        assert await apply_event(first, app.registry, event) is ApplyOutcome.APPLIED
        # The lock wait happens where the checkpoint's row is: here, or (Citus) on a worker node.
        session = await session_id(second, on_citus=citus is not None)
        outcome: list[ApplyOutcome] = []

        async def apply_second() -> None:
            async with second.transaction():
                outcome.append(await apply_event(second, app.registry, event))

        async with anyio.create_task_group() as tg:
            tg.start_soon(apply_second)

            # The second applier either waits for the first's checkpoint row, or (the bug) has
            # applied already; either way it is safe to commit the first now.
            async def waits_or_done() -> bool:
                blocked = await is_blocked(pool, session, on_citus=citus is not None)
                return blocked or bool(outcome)

            await wait_for(waits_or_done)
            await tx.commit()
    assert outcome == [ApplyOutcome.DUPLICATE]
    assert await pool.fetchval("SELECT n FROM tally") == 1
