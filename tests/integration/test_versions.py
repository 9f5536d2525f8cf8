"""Projector versions (S29): a later version is built beside the live one from the journal and
made live in one step; readers ask which version is live; the versions below it are owed
nothing. Oracles: the sums each test's own generator appended (`expected`), never what a
worker saw."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest

from helpers import ADD, SUMS, run_cli, sums
from outbox import Event, Settings, append, db, live_version, running_projector
from outbox.errors import ConfigError, Conflict, NotFound, TransientBatchError
from outbox.model import StoredEvent
from outbox.ops.retire import retire_projector
from outbox.ops.versions import promote_version
from outbox.projection import versions
from outbox.projection.app import Outbox
from outbox.projection.known import list_known, record
from outbox.projection.registry import Promotion
from outbox.worker.batch import Worker
from outbox.worker.runtime import drain_now

# The versions a test declares: {version: what it adds per event (a multiple of `n`)}.
Versions = dict[int, int]


def app_of(
    dsn: str,
    versions_: Versions,
    *,
    failing: str | None = None,
    promote: Promotion = "manual",
    poll_interval: float = 0.5,
) -> Outbox:
    """`roster` in each of `versions_`: one function for all, adding `n` times the version's
    factor under the running track's key (`running_projector()`), so each version's sums say
    what it applied. `failing`: a campaign the lowest version fails on. The highest version is
    promoted `promote`. Each version drops its sums when retired."""
    app = Outbox(Settings(dsn=dsn, batch_size=10, poll_interval=poll_interval))
    lowest, highest = min(versions_), max(versions_)

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        me = running_projector()
        if me.version == lowest and event.campaign_id == failing:
            raise RuntimeError("roster cannot take this campaign")
        n = event.payload["n"] * versions_[me.version]
        await tx.execute(ADD, me.name, event.campaign_id, n)

    for version in versions_:

        async def drop(tx: db.Connection, key: str = f"roster@v{version}") -> None:
            await tx.execute("DELETE FROM sums WHERE projector = $1", key.removesuffix("@v1"))

        app.projector(
            "roster",
            events=["add"],
            version=version,
            promote=promote if version == highest else "manual",
            drop=drop,
        )(add)
    return app


async def history(
    pool: db.Pool, settings: Settings, campaigns: list[str], rng: random.Random
) -> Counter[str]:
    """1 to 4 events on each campaign; what each campaign's sum must be (factor 1)."""
    expected: Counter[str] = Counter()
    for cid in campaigns:
        events = [Event("add", {"n": rng.randint(1, 9)}) for _ in range(rng.randint(1, 4))]
        await append(pool, cid, events, settings=settings)
        expected[cid] += sum(e.payload["n"] for e in events)
    return expected


def times(counts: Counter[str], factor: int) -> Counter[str]:
    return Counter({k: v * factor for k, v in counts.items()})


@pytest.fixture
async def table(pool: db.Pool) -> None:
    await pool.execute(SUMS)


async def audit(pool: db.Pool) -> list[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT projector, action FROM outbox.outbox_projector_audit ORDER BY audit_id"
    )
    return [(r["projector"], r["action"]) for r in rows]


@pytest.mark.usefixtures("table")
async def test_a_version_is_built_beside_the_live_one_and_promoted_in_one_step(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(39)
    campaigns = [f"c{i:02d}" for i in range(30)]
    old = app_of(dsn, {1: 1})
    expected = await history(pool, old.settings, campaigns, rng)
    await drain_now(old, pool)
    assert await live_version(pool, "roster") == 1
    with pytest.raises(NotFound, match="version 2 of projector 'roster' is not recorded"):
        await promote_version(pool, "roster", 2)

    new = app_of(dsn, {1: 1, 2: 10})  # v2 counts ten per unit: its sums tell it apart
    expected += await history(pool, new.settings, rng.sample(campaigns, 8), rng)
    await record(pool, new.registry, "deploy")  # a worker with v2 started: it catches up
    with pytest.raises(Conflict, match="not caught up: its sweep of the journal is under way"):
        await promote_version(pool, "roster", 2)
    assert await live_version(pool, "roster") == 1  # refused: nothing changed
    await drain_now(new, pool)
    assert await sums(pool, "roster") == expected  # v1 went on meanwhile, and stays live
    assert await sums(pool, "roster@v2") == times(expected, 10)

    promoted = await promote_version(pool, "roster", 2, reason="v2 counts tenfold")
    assert (promoted.previous, promoted.version, promoted.forced) == (1, 2, False)
    assert promoted.lag.caught_up
    async with pool.acquire() as conn, conn.transaction():
        assert await live_version(conn, "roster") == 2
        assert await conn.fetchval("SELECT outbox.outbox_live_version('roster')") == 2

    # v1 is owed nothing now: new events reach v2 alone.
    more = await history(pool, new.settings, campaigns[:5], rng)
    await drain_now(new, pool)
    assert await sums(pool, "roster@v2") == times(expected + more, 10)
    assert await sums(pool, "roster") == expected
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    states = {k.projector: (k.version, k.state) for k in await list_known(pool)}
    assert states == {"roster": (1, "superseded"), "roster@v2": (2, "live")}
    assert ("roster@v2", "promote") in await audit(pool)
    again = await promote_version(pool, "roster", 2)
    assert not again.changed


@pytest.mark.usefixtures("table")
async def test_a_forced_promotion_says_what_the_version_lacked(pool: db.Pool, dsn: str) -> None:
    app = app_of(dsn, {1: 1, 2: 1})
    await history(pool, app.settings, ["a", "b"], random.Random(1))
    await record(pool, app.registry, "deploy")
    promoted = await promote_version(pool, "roster", 2, force=True)
    assert promoted.forced
    assert not promoted.lag.swept
    assert await live_version(pool, "roster") == 2


@pytest.mark.usefixtures("table")
async def test_a_failing_live_version_is_released_by_the_promotion_of_the_next(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(7)
    app = app_of(dsn, {1: 1, 2: 2}, failing="bad")
    expected = await history(pool, app.settings, ["ok", "bad"], rng)
    await drain_now(app, pool)
    assert await sums(pool, "roster@v2") == times(expected, 2)
    assert await sums(pool, "roster") == Counter({"ok": expected["ok"]})
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM outbox.projection_holds WHERE projector = 'roster'"
        )
        == 1
    )  # v1 stopped on 'bad', alone (S24)
    promoted = await promote_version(pool, "roster", 2)
    assert promoted.released == 1
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    expected += await history(pool, app.settings, ["bad"], rng)
    await drain_now(app, pool)
    assert await sums(pool, "roster@v2") == times(expected, 2)
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0


@pytest.mark.usefixtures("table")
async def test_a_batch_that_ran_a_superseded_version_after_its_promotion_runs_again_without_it(
    pool: db.Pool, dsn: str
) -> None:
    app = app_of(dsn, {1: 1, 2: 3}, poll_interval=3600.0)  # its reads of the record stay stale
    expected = await history(pool, app.settings, ["a"], random.Random(3))
    await drain_now(app, pool)
    worker = Worker(app, pool)
    async with pool.acquire() as conn:  # the worker read the versions: none superseded
        assert await app.superseded.registry(conn, app.registry) is app.registry
    await promote_version(pool, "roster", 2)
    await append(pool, "a", [Event("add", {"n": 5})], settings=app.settings)
    with pytest.raises(TransientBatchError, match="superseded by a promoted version"):
        await worker.run_once()  # it ran v1 from its stale read: refused, nothing kept
    counts = await worker.run_once()  # read again: v2 alone
    assert counts.claimed == 1
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "roster@v2") == times(expected + Counter({"a": 5}), 3)


@pytest.mark.usefixtures("table")
async def test_retiring_a_superseded_version_drops_its_guards_and_its_read_model(
    pool: db.Pool, dsn: str
) -> None:
    app = app_of(dsn, {1: 1, 2: 1})
    expected = await history(pool, app.settings, ["a", "b"], random.Random(5))
    await drain_now(app, pool)
    with pytest.raises(Conflict, match="version 1 of projector 'roster' is the live one"):
        await retire_projector(pool, "roster", version=1, reason="r")
    await promote_version(pool, "roster", 2)
    with pytest.raises(Conflict, match="'roster@v2' is still in the app"):
        await retire_projector(pool, "roster", version=2, reason="r", registry=app.registry)
    retired = await retire_projector(
        pool, "roster", version=1, reason="v2 is live", registry=app.registry
    )
    assert (retired.record.projector, retired.checkpoints, retired.dropped) == ("roster", 2, True)
    assert await sums(pool, "roster") == Counter()  # its drop hook ran
    assert await sums(pool, "roster@v2") == expected
    left = await pool.fetch("SELECT DISTINCT projector FROM outbox.projection_checkpoints")
    assert [r["projector"] for r in left] == ["roster@v2"]
    assert ("roster", "retire") in await audit(pool)


@pytest.mark.usefixtures("table")
async def test_a_version_registered_auto_is_promoted_by_the_workers_once_caught_up(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(versions, "AUTO_PROMOTE_INTERVAL", 0.0)
    old = app_of(dsn, {1: 1})
    expected = await history(pool, old.settings, ["a", "b", "c"], random.Random(11))
    await drain_now(old, pool)
    app = app_of(dsn, {1: 1, 2: 4}, promote="auto")
    await drain_now(app, pool)
    assert await live_version(pool, "roster") == 2
    assert await sums(pool, "roster@v2") == times(expected, 4)
    entries = await pool.fetch(
        "SELECT actor, reason FROM outbox.outbox_projector_audit WHERE action = 'promote'"
    )
    assert [r["reason"] for r in entries] == ["promote='auto': caught up"]
    assert entries[0]["actor"].startswith("worker ")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"version": 0}, "version must be a whole number from 1, not 0"),
        ({"version": True}, "version must be a whole number from 1, not True"),
        ({"version": "2"}, "version must be a whole number from 1, not '2'"),
        ({"promote": "later"}, "promote must be 'manual' or 'auto', not 'later'"),
    ],
)
def test_a_version_is_checked_when_registered(options: dict[str, object], message: str) -> None:
    app = Outbox(Settings())

    async def fn(tx: db.Connection, event: StoredEvent) -> None: ...

    with pytest.raises(ConfigError, match=message):
        app.projector("roster", events=["add"], **options)(fn)  # type: ignore[arg-type]


def test_a_name_cannot_pose_as_a_version_nor_a_version_come_twice() -> None:
    app = Outbox(Settings())

    async def fn(tx: db.Connection, event: StoredEvent) -> None: ...

    with pytest.raises(ConfigError, match="a name ending '@v<number>' is a version's key"):
        app.projector("roster@v2", events=["add"])(fn)
    app.projector("roster", events=["add"], version=2)(fn)
    with pytest.raises(ConfigError, match="'roster': version 2 registered twice"):
        app.projector("roster", events=["add"], version=2)(fn)
    assert [p.version for p in app.registry.versions("roster")] == [2]
    with pytest.raises(RuntimeError, match="from inside a projector's function"):
        running_projector()


@pytest.mark.usefixtures("table")
async def test_the_command_lines_promote_list_and_retire_versions(pool: db.Pool, dsn: str) -> None:
    app = app_of(dsn, {1: 1, 2: 1})
    await history(pool, app.settings, ["a"], random.Random(2))
    await drain_now(app, pool)
    promoted = run_cli(
        "maintenance", "projector-promote", "roster", "--version", "2", "--json", dsn=dsn
    )
    assert promoted.returncode == 0, promoted.stderr
    body = orjson.loads(promoted.stdout)
    assert (body["mode"], body["previous"], body["version"]) == ("projector-promote", 1, 2)
    listed = orjson.loads(run_cli("maintenance", "projectors", "--json", dsn=dsn).stdout)
    assert [(p["projector"], p["state"]) for p in listed["projectors"]] == [
        ("roster", "superseded"),
        ("roster@v2", "live"),
    ]
    for args, error in [
        (("roster",), "--version is required"),
        (("roster", "--version", "0"), "--version"),
        (("--version", "2"), "name the projector once"),
        (("roster", "--projector", "roster", "--version", "2"), "name the projector once"),
        (("roster", "--version", "7"), "version 7 of projector 'roster' is not recorded"),
    ]:
        refused = run_cli("maintenance", "projector-promote", *args, dsn=dsn)
        assert refused.returncode != 0
        assert error in refused.stderr
        assert "Traceback" not in refused.stderr
    retired = run_cli(
        "maintenance", "projector-retire", "roster", "--version", "1", "--reason", "done", dsn=dsn
    )
    assert retired.returncode == 0, retired.stderr
    assert "retired roster" in retired.stdout
