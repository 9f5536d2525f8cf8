"""A rebuild in place on the catch-up engine (S19, S30): resumed after a kill from its
per-bucket resume points, its progress recorded for the report, the console and the metrics,
one build of a projector at a time, and `replaying()` told to the projector. Oracles: the sums
each test's generator appended (`totals`), never what the engine saw."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections import Counter

import anyio
import orjson
import pytest
from test_build import Journal, Killed, dies_at_step, history, totals
from worker_apps import tally, untally

from helpers import BIN, EXAMPLES, TESTS, run_cli, sums, wait_for
from outbox import Settings, db, replaying
from outbox.errors import ConfigError, Conflict
from outbox.model import EventBatch, StoredEvent
from outbox.ops.report import outbox_report
from outbox.projection import build as engine
from outbox.projection.app import Outbox
from outbox.projection.build import build
from outbox.projection.builds import Progress, list_builds
from outbox.worker.runtime import drain_now


def rebuilt_app(dsn: str) -> Outbox:
    app = Outbox(Settings(dsn=dsn, batch_size=10))
    app.projector("tally", events=["add"], batch=True, reset=untally)(tally)
    return app


async def damaged(pool: db.Pool, dsn: str, campaigns: int, seed: int, damage: str) -> Journal:
    """`rebuilt_app`'s tally applied over a history of `campaigns`, then damaged (`damage`):
    the generator's record of each `add`."""
    journal: Journal = {}
    app = rebuilt_app(dsn)
    names = [f"c{i:03d}" for i in range(campaigns)]
    await history(pool, app.settings, names, random.Random(seed), journal)
    await drain_now(app, pool)
    assert await sums(pool, "tally") == totals(journal, 1)
    await pool.execute(damage)
    return journal


@pytest.mark.usefixtures("table", "small_steps")
async def test_an_in_place_rebuild_repairs_resumes_after_a_kill_and_is_recorded(
    pool: db.Pool, dsn: str
) -> None:
    journal = await damaged(pool, dsn, 40, 40, "UPDATE sums SET n = n * 7")  # all of it
    projector = rebuilt_app(dsn).registry.projectors["tally"]

    with pytest.raises(Killed):
        await build(pool, projector, in_place=True, progress=dies_at_step(6))
    [stopped] = await list_builds(pool)
    assert (stopped.projector, stopped.kind, stopped.state) == ("tally", "in-place", "stopped")
    assert 0 < stopped.events < stopped.events_total
    # In place: readers see repaired campaigns beside damaged ones until it ends.
    partial, right = await sums(pool, "tally"), totals(journal, 1)
    assert {c for c in right if partial[c] == right[c]}
    assert {c for c in right if partial[c] == right[c] * 7}
    # Nothing else builds the projector before the rebuild is finished.
    with pytest.raises(Conflict, match="stopped half way"):
        await build(pool, projector)

    states: list[Progress] = []
    built = await build(pool, projector, in_place=True, connections=2, progress=states.append)
    assert built.complete
    assert built.progress.resumed
    assert await sums(pool, "tally") == totals(journal, 1)
    # Its counters went on from the stopped one's: every event once, in all.
    assert built.progress.events == sum(map(len, journal.values()))
    assert states[0].events >= stopped.events
    [complete] = await list_builds(pool)
    assert (complete.state, complete.events, complete.eta) == (
        "complete",
        built.progress.events,
        None,
    )
    # Its parts, bucket by bucket, add up to what it did (each recorded in its step).
    parts = await pool.fetchval("SELECT sum(events) FROM outbox.outbox_build_buckets")
    assert parts == built.progress.events
    report = await outbox_report(pool)
    assert [b.state for b in report.summary.builds] == ["complete"]
    # A new rebuild starts afresh (the last completed): every campaign reset again.
    again = await build(pool, projector, in_place=True)
    assert not again.progress.resumed
    assert again.progress.events == sum(map(len, journal.values()))
    assert await sums(pool, "tally") == totals(journal, 1)


@pytest.mark.usefixtures("table")
async def test_the_projector_is_told_when_it_replays(pool: db.Pool, dsn: str) -> None:
    seen: list[bool] = []
    app = Outbox(Settings(dsn=dsn))

    async def spy(tx: db.Connection, events: EventBatch) -> None:
        seen.append(replaying())
        await tally(tx, events)

    app.projector("tally", events=["add"], batch=True, reset=untally)(spy)
    journal: Journal = {}
    await history(pool, app.settings, ["a", "b", "c"], random.Random(41), journal)
    await drain_now(app, pool)  # live: from their work rows
    assert seen
    assert not any(seen)
    assert not replaying()
    seen.clear()
    await build(pool, app.registry.projectors["tally"], in_place=True)
    assert seen
    assert all(seen)  # the rebuild's calls
    assert not replaying()
    assert await sums(pool, "tally") == totals(journal, 1)
    # A version deployed onto the history: the workers' catch-up from the journal replays.
    seen.clear()
    app.projector("tally", events=["add"], batch=True, version=2)(spy)
    await drain_now(app, pool)
    assert seen
    assert all(seen)
    assert await sums(pool, "tally@v2") == totals(journal, 2)


@pytest.mark.usefixtures("table")
async def test_one_build_of_a_projector_at_a_time(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "WHOLE_TRIES", 2)
    app = rebuilt_app(dsn)
    await history(pool, app.settings, ["a"], random.Random(42), {})
    projector = app.registry.projectors["tally"]
    async with pool.acquire() as other:  # another build's session holds the lock
        assert await other.fetchval("SELECT outbox.outbox_lock_build_bucket('tally', -1, true)")
        with pytest.raises(Conflict, match="a build of projector 'tally' is running"):
            await build(pool, projector, in_place=True)
        await other.execute(
            "INSERT INTO outbox.outbox_builds (projector, kind, state) "
            "VALUES ('tally', 'in-place', 'running')"
        )
        assert [b.state for b in await list_builds(pool)] == ["running"]
        await other.fetchval("SELECT outbox.outbox_lock_build_bucket('tally', -1, false)")
        # Recorded running, its lock gone with its process: stopped.
        assert [b.state for b in await list_builds(pool)] == ["stopped"]


@pytest.mark.usefixtures("table")
async def test_the_command_line_rebuild_shows_progress_and_resumes_after_sigkill(
    pool: db.Pool, dsn: str
) -> None:
    journal = await damaged(pool, dsn, 60, 43, "UPDATE sums SET n = 0")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
        "OUTBOX_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(EXAMPLES)]),
    }
    args = ["projections-rebuild", "--app", "worker_apps:rebuilt", "--projector", "tally"]

    # Slowed to 40 events/s: killed once a step has committed (the drain's catch-up by the
    # engine recorded a build of its own before: this one is in place).
    async def recorded() -> bool:
        done = await pool.fetchval(
            "SELECT sum(p.events) FROM outbox.outbox_build_buckets p "
            "JOIN outbox.outbox_builds b USING (projector) WHERE b.kind = 'in-place'"
        )
        return bool(done)

    async with await anyio.open_process(
        [str(BIN / "maintenance"), *args, "--yes", "--json", "--max-rate", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as slow:
        await wait_for(recorded)
        slow.send_signal(signal.SIGKILL)
        assert await slow.wait() == -signal.SIGKILL
    report = run_cli("maintenance", "outbox-report", "--json", dsn=dsn)
    [stopped] = orjson.loads(report.stdout)["summary"]["builds"]
    assert (stopped["projector"], stopped["state"], stopped["kind"]) == (
        "tally",
        "stopped",
        "in-place",
    )
    assert 0 < stopped["events"] < stopped["events_total"]
    done = run_cli("maintenance", *args, "--yes", "--json", "--connections", "3", dsn=dsn, env=env)
    assert done.returncode == 0, done.stderr
    *ticks, end = map(orjson.loads, done.stdout.splitlines())
    assert ticks[0]["resumed"] is True
    assert ticks[0]["eta"] is None or ticks[0]["eta"] >= 0
    assert end["rebuilt"] is True
    # Every step's part was recorded in its transaction: exact across the SIGKILL.
    assert end["applied"]["tally"] == sum(map(len, journal.values()))
    assert await sums(pool, "tally") == totals(journal, 1)
    table = run_cli("maintenance", "outbox-report", dsn=dsn)
    assert "builds by the catch-up engine" in table.stdout
    assert "complete" in table.stdout


async def test_a_lease_projector_is_given_its_history_only_when_it_asks(
    pool: db.Pool, dsn: str
) -> None:
    delivered: list[tuple[str, int, bool]] = []

    async def courier(_: db.Pool, event: StoredEvent) -> None:
        delivered.append((event.campaign_id, event.seq, replaying()))

    unasked = Outbox(Settings(dsn=dsn))
    unasked.projector("courier", events=["add"], transactional=False)(courier)
    with pytest.raises(ConfigError, match="never given again unless it is registered with"):
        engine.buildable(unasked.registry.projectors["courier"])
    with pytest.raises(ConfigError, match="replay=True is for lease-mode projectors"):
        unasked.projector("roster", events=["add"], replay=True)(tally)
    app = Outbox(Settings(dsn=dsn))
    app.projector("courier", events=["add"], transactional=False, replay=True)(courier)
    journal: Journal = {}
    await history(pool, app.settings, [f"c{i}" for i in range(9)], random.Random(44), journal)
    built = await build(pool, app.registry.projectors["courier"], connections=2)
    assert built.complete
    assert (built.progress.kind, built.progress.events) == (
        "replay",
        sum(map(len, journal.values())),
    )
    # Each campaign's events of its types, once each, in seq order, all as history.
    assert Counter(c for c, _, _ in delivered) == Counter(
        {c: len(ns) for c, ns in journal.items() if ns}
    )
    for campaign in journal:
        seqs = [s for c, s, _ in delivered if c == campaign]
        assert seqs == sorted(set(seqs))
    assert all(replay for _, _, replay in delivered)
