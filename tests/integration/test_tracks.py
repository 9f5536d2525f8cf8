"""Each projector on its own track (S24): a failing, dead or paused projector holds only itself;
the campaign's other projectors apply its events at once, and nothing is applied twice. Oracles:
the sums each test's own generator appended, per projector (`sums`), never what a worker saw."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from helpers import ADD, SUMS, Clock, sums
from outbox import Event, Settings, append, db
from outbox.errors import Conflict, NotFound, PermanentError, TransientBatchError
from outbox.model import StoredEvent
from outbox.ops.discard import discard_one
from outbox.ops.health import health
from outbox.ops.replay import replay
from outbox.ops.report import audit
from outbox.ops.requeue import requeue_dead, requeue_one, retry_failed, retry_one
from outbox.ops.retire import retire_projector
from outbox.projection.app import Outbox
from outbox.projection.known import list_known, record
from outbox.projection.pauses import pause, resume
from outbox.worker.batch import Worker
from outbox.worker.registration import Registration

HOUR = 3600.0


def catch_up(clock: Clock) -> None:
    """The worker's clock moved to the real time, after appends made now (the backoffs of the
    tests' settings are minutes: no hold comes due by it)."""
    clock.at = max(clock.at, datetime.now(UTC))


class Broken(Exception):
    pass


class Poisoned(PermanentError):
    pass


def tracked_app(
    settings: Settings,
    failing: dict[str, set[tuple[str, int] | str]],
    *,
    ordered: Sequence[str] = ("roster", "stats"),
    unordered: Sequence[str] = (),
    unguarded: Sequence[str] = (),
    poisoned: Sequence[str] = (),
) -> Outbox:
    """Per-event projectors adding each event's `n` into `sums` under their names: `ordered`
    ones (a checkpoint), `unordered` ones (idempotent: a marker), `unguarded` ones (neither).
    A projector named in `failing` raises on the campaigns (or (campaign, seq) events) listed
    there, for as long as they are listed; a `poisoned` one raises a PermanentError (dead at
    once)."""
    app = Outbox(settings)

    def register(name: str, *, ordered: bool, idempotent: bool = False) -> None:
        async def add(tx: db.Connection, event: StoredEvent, name: str = name) -> None:
            broken = failing.get(name, set())
            if event.campaign_id in broken or (event.campaign_id, event.seq) in broken:
                why = f"{name} cannot take {event.campaign_id} seq {event.seq}"
                raise Poisoned(why) if name in poisoned else Broken(why)
            await tx.execute(ADD, name, event.campaign_id, event.payload["n"])

        app.projector(name, events=["add"], ordered=ordered, idempotent=idempotent)(add)

    for name in ordered:
        register(name, ordered=True)
    for name in unordered:
        register(name, ordered=False, idempotent=True)
    for name in unguarded:
        register(name, ordered=False)
    return app


async def add_events(
    pool: db.Pool, settings: Settings, expected: Counter[str], campaign: str, values: list[int]
) -> None:
    await append(pool, campaign, [Event("add", {"n": v}) for v in values], settings=settings)
    expected[campaign] += sum(values)


async def holds(pool: db.Pool) -> list[tuple[str, str, int, str]]:
    rows = await pool.fetch(
        "SELECT campaign_id, projector, seq, status FROM outbox.projection_holds "
        "ORDER BY campaign_id, projector, seq"
    )
    return [(r["campaign_id"], r["projector"], r["seq"], r["status"]) for r in rows]


async def work_rows(pool: db.Pool) -> list[tuple[str, int, str]]:
    rows = await pool.fetch(
        "SELECT campaign_id, seq, status FROM outbox.projection_apply_outbox "
        "ORDER BY campaign_id, seq"
    )
    return [(r["campaign_id"], r["seq"], r["status"]) for r in rows]


def without(expected: Counter[str], *campaigns: str) -> Counter[str]:
    return Counter({c: n for c, n in expected.items() if c not in campaigns})


@pytest.fixture(autouse=True)
async def sums_table(pool: db.Pool) -> None:
    await pool.execute(SUMS)


CAMPAIGNS = [f"t-{i:02d}" for i in range(12)]


async def test_a_failing_ordered_projector_holds_only_itself_on_its_campaigns(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-03", "t-07"}}
    app = tracked_app(settings, failing, unordered=["audit"])
    expected: Counter[str] = Counter()
    for i, cid in enumerate(CAMPAIGNS):
        await add_events(pool, settings, expected, cid, [i + 1, 2, 3])
    clock = Clock()
    counts = await Worker(app, pool, now=clock).drain()
    assert (counts.failed, counts.dead) == (2, 0)  # one attempt each, charged to `stats` alone
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "audit") == expected
    assert await sums(pool, "stats") == without(expected, "t-03", "t-07")
    assert await holds(pool) == [
        ("t-03", "stats", 1, "failed"),
        ("t-07", "stats", 1, "failed"),
    ]
    # The seed's columns: the row `stats` failed on stays, failed; the rows after it went.
    assert await work_rows(pool) == [("t-03", 1, "failed"), ("t-07", 1, "failed")]

    # New events on the held campaigns apply to the others at once: no backoff waited out.
    for cid in ("t-03", "t-07"):
        await add_events(pool, settings, expected, cid, [100])
    catch_up(clock)
    counts = await Worker(app, pool, now=clock).drain()
    assert (counts.applied, counts.failed) == (2, 0)
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "audit") == expected

    # Fixed, and its backoff over: `stats` goes on from its checkpoint through the journal.
    failing["stats"].clear()
    clock.advance(HOUR)
    counts = await Worker(app, pool, now=clock).drain()
    assert (counts.failed, counts.dead) == (0, 0)
    assert await sums(pool, "stats") == expected  # every event once, none twice
    assert await sums(pool, "roster") == expected
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_an_unordered_projector_failing_holds_that_event_alone(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"audit": {("t-01", 2)}}
    app = tracked_app(
        settings, failing, ordered=["roster"], unordered=["audit"], unguarded=["tally"]
    )
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:3]:
        await add_events(pool, settings, expected, cid, [1, 10, 100])
    clock = Clock()
    await Worker(app, pool, now=clock).drain()
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "tally") == expected
    # `audit` missed only the event it failed on: the campaign's later events reached it.
    assert await sums(pool, "audit") == expected - Counter({"t-01": 10})
    assert await holds(pool) == [("t-01", "audit", 2, "failed")]
    assert await work_rows(pool) == [("t-01", 2, "failed")]
    failing["audit"].clear()
    clock.advance(HOUR)
    await Worker(app, pool, now=clock).drain()
    assert await sums(pool, "audit") == expected
    # The retry ran the row for its holder alone: the projector without a guard, which had
    # applied it, did not run it again.
    assert await sums(pool, "tally") == expected
    assert await sums(pool, "roster") == expected
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_a_dead_projector_stops_on_its_campaign_and_new_events_reach_the_others(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-00"}}
    app = tracked_app(settings, failing)
    expected: Counter[str] = Counter()
    await add_events(pool, settings, expected, "t-00", [1, 2])
    clock = Clock()
    worker = Worker(app, pool, now=clock)
    for _ in range(settings.max_attempts):
        await worker.drain()
        clock.advance(HOUR)
    assert await holds(pool) == [("t-00", "stats", 1, "dead")]
    assert await work_rows(pool) == [("t-00", 1, "dead")]
    attempts = await pool.fetchval("SELECT attempt_count FROM outbox.projection_holds")
    assert attempts == settings.max_attempts
    # The campaign waits for nothing now; an append makes it due, and `roster` applies it.
    await add_events(pool, settings, expected, "t-00", [50])
    catch_up(clock)
    counts = await worker.drain()
    assert (counts.applied, counts.failed, counts.dead) == (1, 0, 0)
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "stats") == Counter()


async def test_a_paused_projector_holds_only_itself_and_catches_up_on_resume(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    app = tracked_app(settings, {}, unordered=["audit"])
    await pause(pool, "stats", actor="test", reason="a fix is on its way")
    await pause(pool, "audit", actor="test", reason="a fix is on its way")
    expected: Counter[str] = Counter()
    for i, cid in enumerate(CAMPAIGNS[:4]):
        await add_events(pool, settings, expected, cid, [i + 1, 5])
    clock = Clock()
    counts = await Worker(app, pool, now=clock).drain()
    assert counts.failed == 0
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "stats") == Counter()
    assert await sums(pool, "audit") == Counter()
    await resume(pool, "stats", actor="test")
    await resume(pool, "audit", actor="test")
    clock.advance(HOUR)
    fresh = tracked_app(settings, {}, unordered=["audit"])  # reads the pauses afresh
    counts = await Worker(fresh, pool, now=clock).drain()
    assert counts.failed == 0
    assert await sums(pool, "stats") == expected
    assert await sums(pool, "audit") == expected
    assert await sums(pool, "roster") == expected
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_requeue_and_discard_act_on_one_projectors_hold(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-00"}, "audit": {("t-01", 1)}}
    app = tracked_app(settings, failing, unordered=["audit"], poisoned=["stats", "audit"])
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:3]:
        await add_events(pool, settings, expected, cid, [1, 10])
    clock = Clock()
    counts = await Worker(app, pool, now=clock).drain()
    assert (counts.failed, counts.dead) == (0, 2)
    assert await holds(pool) == [("t-00", "stats", 1, "dead"), ("t-01", "audit", 1, "dead")]
    assert await work_rows(pool) == [("t-00", 1, "dead"), ("t-01", 1, "dead")]
    with pytest.raises(NotFound, match="projector 'audti' is not recorded"):  # a typo
        await requeue_dead(pool, limit=10, projector="audti")
    await record(pool, app.registry, "w-1")  # as a worker records what it runs
    with pytest.raises(Conflict, match="'audit' is not dead on row 't-00' seq 1"):
        await requeue_one(pool, "t-00", 1, projector="audit")
    # A replay would run the row's other projectors again: refused, nothing changes.
    with pytest.raises(Conflict, match="waits for stats alone"):
        await replay(app, pool, "t-00", 1)
    preview = await requeue_dead(pool, limit=10, projector="stats", dry_run=True)
    assert [(r.campaign_id, r.seq) for r in preview.rows] == [("t-00", 1)]

    # `stats` fixed and requeued: it goes on from its checkpoint through the journal.
    failing["stats"].clear()
    await requeue_one(pool, "t-00", 1, projector="stats", reason="fixed in 1.4.2")
    catch_up(clock)
    await Worker(app, pool, now=clock).drain()
    assert await sums(pool, "stats") == expected
    assert await holds(pool) == [("t-01", "audit", 1, "dead")]

    # `audit` will never take t-01's first event: discarded for it alone.
    with pytest.raises(Conflict, match="'stats' holds nothing"):
        await discard_one(pool, app.registry, "t-01", 1, reason="bad", projector="stats")
    await discard_one(pool, app.registry, "t-01", 1, reason="bad data", projector="audit")
    assert await holds(pool) == []
    assert await work_rows(pool) == []
    assert await sums(pool, "audit") == expected - Counter({"t-01": 1})
    assert await sums(pool, "roster") == expected
    entries = (await audit(pool, limit=10)).entries
    assert [(e.action, e.campaign_id, e.projector) for e in entries] == [
        ("discard", "t-01", "audit"),
        ("requeue", "t-00", "stats"),
    ]


async def test_a_rolling_deploy_never_completes_a_new_projectors_share_on_the_old_workers(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn)
    old = tracked_app(settings, {}, ordered=["roster"], unordered=[])
    new = tracked_app(settings, {}, ordered=["roster", "stats"], unordered=["audit"])
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:4]:
        await add_events(pool, settings, expected, cid, [1, 2])
    await Worker(old, pool).drain()  # before the deploy
    # The first new worker starts (it records its projectors); old ones still run.
    await record(pool, new.registry, "new-worker")
    for cid in CAMPAIGNS[:4]:
        await add_events(pool, settings, expected, cid, [30])
    # An old worker that read the record before it changed keeps nothing of its batch (the
    # settle refuses it, as a transient failure: no attempt), reads the record again, and
    # leaves the new projectors' share in holds. (Whether it read the record before the change
    # is the server's timing: Citus often reads it afresh first.)
    worker = Worker(old, pool)
    refused: TransientBatchError | None = None
    try:
        counts = await worker.drain()
    except TransientBatchError as exc:
        refused = exc
    if refused is not None:
        assert "projector audit, stats is recorded" in str(refused)
        assert await sums(pool, "roster") == expected - Counter({c: 30 for c in CAMPAIGNS[:4]})
        counts = await worker.drain()
    assert (counts.held, counts.applied) == (0, 4)  # `roster` applied them
    # What it left is counted as another worker's, not as paused: nothing is paused.
    assert (counts.paused, counts.elsewhere) == (0, 8)
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "stats") == Counter()
    # What `stats` and `audit` owe waits for a worker that runs them.
    assert (
        {(c, p, s) for c, p, s, _ in await holds(pool)}
        == {
            *((cid, "stats", 3) for cid in CAMPAIGNS[:4]),  # the first event it owes
            *((cid, "audit", 3) for cid in CAMPAIGNS[:4]),
        }
    )
    clock = Clock()
    clock.advance(HOUR)  # past the poll interval the old workers left the holds for
    await Worker(new, pool, now=clock).drain()
    assert await sums(pool, "stats") == expected  # its history too, from the journal
    # `audit` (unordered, no history catch-up: S24) got the events the old workers left it.
    assert await sums(pool, "audit") == Counter({cid: 30 for cid in CAMPAIGNS[:4]})
    assert await sums(pool, "roster") == expected
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_an_old_worker_leaves_a_new_types_events_to_its_projector_not_unapplied(
    pool: db.Pool, dsn: str
) -> None:
    """Events of a type only another worker's projector takes are held for it, not completed
    unsubscribed, nor failed as unknown under OUTBOX_UNSUBSCRIBED=retry (S8, S24)."""
    settings = Settings(dsn=dsn, unsubscribed="retry")
    old = tracked_app(settings, {}, ordered=["roster"])
    new = tracked_app(settings, {}, ordered=["roster"])

    @new.projector("bonus", events=["bonus"])
    async def bonus(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(ADD, "bonus", event.campaign_id, event.payload["n"])

    await record(pool, new.registry, "new-worker")
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:3]:
        await add_events(pool, settings, expected, cid, [1])
        await append(pool, cid, [Event("bonus", {"n": 5})], settings=settings)
    worker = Worker(old, pool)
    counts = await worker.drain()
    assert (counts.applied, counts.held, counts.skipped, counts.failed) == (3, 3, 0, 0)
    assert [(c, p, s) for c, p, s, _ in await holds(pool)] == [
        (cid, "bonus", 2) for cid in CAMPAIGNS[:3]
    ]
    assert await sums(pool, "roster") == expected
    # At rest `bonus` trails each head by the `add` the old worker applied (it does not run
    # it), as docs/worker.md says; its next event passes it from the journal, unapplied.
    checkpoint = (
        "SELECT campaign_id, applied_seq FROM outbox.projection_checkpoints WHERE projector = $1"
    )
    assert await pool.fetch(checkpoint, "bonus") == []
    clock = Clock()
    clock.advance(HOUR)  # past the poll interval the old worker left the holds for
    await Worker(new, pool, now=clock).drain()
    assert sorted(map(tuple, await pool.fetch(checkpoint, "bonus"))) == [
        (cid, 2) for cid in CAMPAIGNS[:3]
    ]
    assert await sums(pool, "bonus") == Counter({cid: 5 for cid in CAMPAIGNS[:3]})
    assert await sums(pool, "roster") == expected
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_a_retired_projector_owes_nothing_its_holds_and_their_rows_go(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-00"}, "audit": {("t-00", 1)}}
    app = tracked_app(settings, failing, unordered=["audit"], poisoned=["stats", "audit"])
    await record(pool, app.registry, "worker")
    await add_events(pool, settings, Counter(), "t-00", [1, 2])
    await Worker(app, pool).drain()
    assert await holds(pool) == [("t-00", "audit", 1, "dead"), ("t-00", "stats", 1, "dead")]
    await retire_projector(pool, "stats", reason="replaced by stats-v2")
    # The row stays for `audit`, which still owes it; `stats` owes nothing now.
    assert await holds(pool) == [("t-00", "audit", 1, "dead")]
    assert await work_rows(pool) == [("t-00", 1, "dead")]
    await retire_projector(pool, "audit", reason="no longer needed")
    assert await holds(pool) == []
    assert await work_rows(pool) == []


async def test_health_judges_one_projector_by_its_own_figures(pool: db.Pool, dsn: str) -> None:
    """`stats` dead on one event and `audit` failing on another: the install is unhealthy,
    `roster` is healthy by its own figures (another projector's dead rows are not its own),
    and each of the two is judged by its own dead and failing counts."""
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-00"}, "audit": {("t-01", 1)}}
    app = tracked_app(settings, failing, unordered=["audit"], poisoned=["stats"])
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:2]:
        await add_events(pool, settings, expected, cid, [1, 10])
    await Worker(app, pool, now=Clock()).drain()
    await record(pool, app.registry, "w-1")
    await Registration(
        pool, "w-1", "apply", 1, {p.projector: str(p.fingerprint) for p in await list_known(pool)}
    ).register()
    install = await health(pool, max_failed=0)
    assert install.reasons == ["1 dead row(s), over 0", "1 failed row(s), over 0"]
    roster = await health(pool, projector="roster", max_failed=0)
    assert roster.healthy, roster.reasons
    assert roster.projector is not None
    assert (roster.projector.dead, roster.projector.failed) == (0, 0)
    stats = await health(pool, projector="stats", max_failed=0)
    assert stats.reasons == ["projector 'stats' is dead on 1 event(s), over 0"]
    assert (await health(pool, projector="stats", max_dead=1)).healthy
    failing_audit = await health(pool, projector="audit", max_failed=0)
    assert failing_audit.reasons == ["projector 'audit' is failing on 1 event(s), over 0"]
    assert (await health(pool, projector="audit")).healthy  # failing is judged when asked


async def pass_over(worker: Worker) -> None:
    """Batches until no bucket has due work (failed work waits for its backoff)."""
    while (await worker.run_once()).claimed:
        pass


async def test_retry_now_makes_failed_work_due_at_once_and_keeps_its_attempts(
    pool: db.Pool, dsn: str
) -> None:
    """After a fix, failed work need not wait out its backoff (120 s here): a retry makes it
    due now, one projector's holds or one row at a time, attempts kept, audited as `retry`."""
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    failing: dict[str, set[tuple[str, int] | str]] = {"stats": {"t-00"}, "audit": {("t-01", 1)}}
    app = tracked_app(settings, failing, unordered=["audit"])
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:2]:
        await add_events(pool, settings, expected, cid, [1, 10])
    await record(pool, app.registry, "w-1")
    worker = Worker(app, pool)
    await pass_over(worker)
    assert await holds(pool) == [("t-00", "stats", 1, "failed"), ("t-01", "audit", 1, "failed")]
    failing.clear()  # the fix is deployed
    with pytest.raises(Conflict, match=r"is failed, not dead \(maintenance outbox-retry"):
        await requeue_one(pool, "t-00", 1)
    preview = await retry_failed(pool, limit=10, projector="stats", dry_run=True)
    assert [(r.campaign_id, r.seq, r.attempt_count) for r in preview.rows] == [("t-00", 1, 1)]
    done = await retry_failed(pool, limit=10, projector="stats", reason="fixed")
    assert (done.matched, done.retried) == (1, 1)
    await pass_over(worker)
    assert await sums(pool, "stats") == expected  # t-00 at once, no backoff waited
    assert await holds(pool) == [("t-01", "audit", 1, "failed")]  # not audit's: not asked
    with pytest.raises(Conflict, match="projector 'roster' is not failed on row 't-01' seq 1"):
        await retry_one(pool, "t-01", 1, projector="roster")
    await retry_one(pool, "t-01", 1, projector="audit")
    await pass_over(worker)
    assert await holds(pool) == []
    for name in ("roster", "stats", "audit"):
        assert await sums(pool, name) == expected, name
    retried = [e for e in (await audit(pool)).entries if e.action == "retry"]
    assert sorted((e.campaign_id, e.projector, e.previous_attempt_count) for e in retried) == [
        ("t-00", "stats", 1),
        ("t-01", "audit", 1),
    ]
