"""The projectors the database knows (S23): recorded by the workers that run them, kept while
a worker without one still runs, left only through `maintenance projector-retire`."""

from __future__ import annotations

import orjson
import pytest

from helpers import run_cli
from outbox import Event, Settings, append, db
from outbox.errors import Conflict, NotFound, ValidationError
from outbox.model import StoredEvent
from outbox.ops.pause import pause_projector
from outbox.ops.retire import list_projectors, retire_projector
from outbox.projection.app import Outbox
from outbox.worker.runtime import drain_now


def app_of(dsn: str, *names: str) -> Outbox:
    """Ordered per-event projectors on `a`, plus an unordered idempotent `tally` on `b`."""
    app = Outbox(Settings(dsn=dsn))

    async def nothing(tx: db.Connection, event: StoredEvent) -> None:
        return None

    for name in names:
        if name == "tally":
            app.projector(name, events=["b"], ordered=False, idempotent=True)(nothing)
        else:
            app.projector(name, events=["a", "b"])(nothing)
    return app


async def recorded(pool: db.Pool) -> dict[str, tuple[list[str], bool, bool]]:
    return {
        p.projector: (p.events, p.ordered, p.transactional) for p in await list_projectors(pool)
    }


async def test_a_worker_records_its_projectors_and_one_without_them_keeps_them(
    pool: db.Pool, dsn: str
) -> None:
    await drain_now(app_of(dsn, "roster", "tally"), pool)
    assert await recorded(pool) == {
        "roster": (["a", "b"], True, True),
        "tally": (["b"], False, True),
    }
    first = {p.projector: p for p in await list_projectors(pool)}
    # A worker of the previous release, without `tally`, starts: `tally` stays known.
    await drain_now(app_of(dsn, "roster"), pool)
    after = {p.projector: p for p in await list_projectors(pool)}
    assert set(after) == {"roster", "tally"}
    assert after["tally"] == first["tally"]
    assert after["roster"].first_seen_at == first["roster"].first_seen_at
    assert after["roster"].last_seen_at > first["roster"].last_seen_at


async def test_a_retirement_is_checked_audited_and_drops_only_that_projectors_guards(
    pool: db.Pool, dsn: str
) -> None:
    app = app_of(dsn, "roster", "tally", "old")
    settings = app.settings
    await append(pool, "c", [Event("a", {}), Event("b", {})], settings=settings)
    await drain_now(app, pool)
    await pause_projector(pool, "old", reason="broken")
    newer = app_of(dsn, "roster", "tally")  # the next release, still with roster and tally
    with pytest.raises(ValidationError, match="reason"):
        await retire_projector(pool, "old", reason=" ")
    with pytest.raises(Conflict, match="still in the app"):
        await retire_projector(pool, "roster", reason="r", registry=newer.registry)
    with pytest.raises(NotFound, match=r"'nope' is not recorded \(recorded: old, roster, tally\)"):
        await retire_projector(pool, "nope", reason="r")
    kept = await retire_projector(pool, "tally", reason="moved")
    assert (kept.checkpoints, kept.markers) == (0, 0)
    assert (
        await pool.fetchval("SELECT count(*) FROM outbox.processed_markers WHERE handler = 'tally'")
        == 1
    )  # kept: no --drop-guards
    retired = await retire_projector(pool, "old", reason="gone", drop_guards=True)
    assert (retired.record.projector, retired.checkpoints, retired.markers) == ("old", 1, 0)
    assert set(await recorded(pool)) == {"roster"}
    guards = await pool.fetch("SELECT projector FROM outbox.projection_checkpoints")
    assert [r["projector"] for r in guards] == ["roster"]
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_projector_pauses") == 0
    audit = await pool.fetch(
        "SELECT projector, action, reason FROM outbox.outbox_projector_audit ORDER BY audit_id"
    )
    assert [tuple(r) for r in audit] == [
        ("old", "pause", "broken"),
        ("tally", "retire", "moved"),
        ("old", "retire", "gone"),
    ]


async def test_the_command_lines_list_and_retire(pool: db.Pool, dsn: str) -> None:
    await drain_now(app_of(dsn, "roster", "old"), pool)
    listed = run_cli("maintenance", "projectors", "--json", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    names = [p["projector"] for p in orjson.loads(listed.stdout)["projectors"]]
    assert names == ["old", "roster"]
    unconfirmed = run_cli(
        "maintenance", "projector-retire", "--projector", "old", "--reason", "r",
        "--drop-guards", dsn=dsn,
    )  # fmt: skip
    assert unconfirmed.returncode == 2
    assert unconfirmed.stderr.strip().count("\n") == 0
    assert "pass --yes" in unconfirmed.stderr
    assert set(await recorded(pool)) == {"old", "roster"}  # nothing done
    done = run_cli(
        "maintenance", "projector-retire", "--projector", "old", "--reason", "r",
        "--drop-guards", "--yes", dsn=dsn,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "retired old" in done.stdout
    assert set(await recorded(pool)) == {"roster"}


async def test_workers_starting_together_record_a_new_projector_once(pool: db.Pool) -> None:
    """Two workers that first record the same projectors at the same instant (a fleet started
    together) both start: the second insert meets the first's row in the (base, version) key,
    which its ON CONFLICT does not arbitrate, and records again, finding it (the fault tier's
    postgres_restart met it as a worker's exit 1)."""
    import anyio

    from outbox.projection.known import record

    for round_ in range(12):
        app = Outbox()

        @app.projector(f"together_{round_}", events=["t"])
        async def together(conn: db.Connection, event: StoredEvent) -> None:
            pass

        @app.projector(f"together_{round_}", events=["t"], version=2)
        async def together_v2(conn: db.Connection, event: StoredEvent) -> None:
            pass

        firsts: list[list[str]] = []

        async def start(app: Outbox, worker: str, firsts: list[list[str]]) -> None:
            firsts.append(await record(pool, app.registry, worker))

        async with anyio.create_task_group() as tg:
            for worker in ("w1", "w2", "w3"):
                tg.start_soon(start, app, worker, firsts)
        first_seen = sorted(name for names in firsts for name in names)
        assert first_seen == sorted(app.registry.projectors)  # each by one worker, once
