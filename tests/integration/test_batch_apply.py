"""The batch apply path: batch projectors, set-based guards, failure isolation (S6, S17, S18).

Oracles come from the test's own generator (what it appended, counted here), never from the
worker's view of the stream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from helpers import campaigns_in_one_bucket, queue_campaigns
from outbox import Event, PermanentError, Settings, append, db
from outbox.errors import CheckpointGap
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker
from outbox.worker.runtime import open_pool

TOTALS = """
CREATE TABLE totals (campaign_id text PRIMARY KEY, n bigint NOT NULL, last_seq bigint NOT NULL);
CREATE TABLE calls (projector text NOT NULL, size int NOT NULL);
"""


def batch_app(settings: Settings, *, ordered: bool, idempotent: bool) -> Outbox:
    app = Outbox(settings)

    @app.projector("totals", events=["add"], batch=True, ordered=ordered, idempotent=idempotent)
    async def totals(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
        await tx.execute("INSERT INTO calls VALUES ('totals', $1)", len(events))
        await tx.execute(
            "INSERT INTO totals (campaign_id, n, last_seq) "
            "SELECT c, sum(n), max(s) FROM unnest($1::text[], $2::bigint[], $3::bigint[]) "
            "AS e(c, n, s) GROUP BY c "
            "ON CONFLICT (campaign_id) DO UPDATE SET n = totals.n + excluded.n, "
            "last_seq = greatest(totals.last_seq, excluded.last_seq)",
            [e.campaign_id for e in events],
            [e.payload["n"] for e in events],
            [e.seq for e in events],
        )

    return app


async def appended(
    pool: db.Pool, settings: Settings, campaigns: int, per: int, *, one_bucket: bool = False
) -> Counter[str]:
    """Append `per` events to each campaign (`one_bucket`: campaigns one batch can claim
    together); the oracle: their sum per campaign."""
    expected: Counter[str] = Counter()
    names = (
        campaigns_in_one_bucket(campaigns, "c")
        if one_bucket
        else [f"c{c:03d}" for c in range(campaigns)]
    )
    for c, cid in enumerate(names):
        values = [(c * 7 + i) % 11 + 1 for i in range(per)]
        await append(pool, cid, [Event("add", {"n": v}) for v in values], settings=settings)
        expected[cid] = sum(values)
    return expected


async def totals(pool: db.Pool) -> Counter[str]:
    rows = await pool.fetch("SELECT campaign_id, n FROM totals")
    return Counter({r["campaign_id"]: r["n"] for r in rows})


@pytest.mark.parametrize(
    ("ordered", "idempotent"),
    [(True, False), (False, True), (False, False)],
    ids=["checkpointed", "markers", "unguarded"],
)
async def test_a_batch_projector_applies_every_event_once_in_few_calls(
    pool: db.Pool, dsn: str, ordered: bool, idempotent: bool
) -> None:
    await pool.execute(TOTALS)
    settings = Settings(dsn=dsn, batch_size=100)
    expected = await appended(pool, settings, campaigns=30, per=20)
    worker = Worker(batch_app(settings, ordered=ordered, idempotent=idempotent), pool)
    sizes = []
    while (counts := await worker.run_once()).claimed:
        sizes.append(counts.applied)
    assert sum(sizes) == 600
    assert await totals(pool) == expected
    calls = await pool.fetch("SELECT size FROM calls ORDER BY size")
    assert sorted(r["size"] for r in calls) == sorted(sizes)  # one call per batch, all of it


async def test_redelivered_events_are_skipped_set_wise(pool: db.Pool, dsn: str) -> None:
    """A batch whose events were partly applied already (their work rows came back, as after
    a restore or a reconcile) applies only the rest: checkpoints and markers both."""
    await pool.execute(TOTALS)
    settings = Settings(dsn=dsn)
    for ordered, idempotent in [(True, False), (False, True)]:
        await pool.execute("TRUNCATE totals, calls, outbox.projection_apply_outbox")
        await pool.execute("TRUNCATE outbox.event_journal, outbox.campaign_head_keys CASCADE")
        app = batch_app(settings, ordered=ordered, idempotent=idempotent)
        expected = await appended(pool, settings, campaigns=3, per=4)
        await Worker(app, pool).drain()
        # The same work rows again: every event a duplicate, nothing changes.
        await pool.execute(
            "INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type) "
            "SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal"
        )
        await queue_campaigns(pool)
        counts = await Worker(app, pool).drain()
        assert (counts.applied, counts.skipped) == (0, 12)
        assert await totals(pool) == expected


async def _lost_first_row(pool: db.Pool, dsn: str) -> tuple[Outbox, str, str]:
    """Campaigns `a` (3 events of 1) and `b` (2 of 5) in one bucket, `a`'s first work row
    deleted by hand: the ordered projector's checkpoint stands at 0 below `a`'s first row."""
    await pool.execute(TOTALS)
    settings = Settings(dsn=dsn)
    app = batch_app(settings, ordered=True, idempotent=False)
    a, b = campaigns_in_one_bucket(2, "g")  # one batch claims both
    await append(pool, a, [Event("add", {"n": 1})] * 3, settings=settings)
    await append(pool, b, [Event("add", {"n": 5})] * 2, settings=settings)
    await pool.execute(
        "DELETE FROM outbox.projection_apply_outbox WHERE campaign_id = $1 AND seq = 1", a
    )
    return app, a, b


async def test_an_event_whose_row_was_deleted_is_applied_from_the_journal(
    pool: db.Pool, dsn: str
) -> None:
    app, a, b = await _lost_first_row(pool, dsn)
    counts = await Worker(app, pool).run_once()
    assert (counts.applied, counts.failed, counts.dead, counts.behind) == (4, 0, 0, 0)
    assert await totals(pool) == Counter({a: 3, b: 10})  # seq 1 of `a` too, once
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0


async def test_a_seq_the_journal_lacks_fails_its_successor_dead_naming_the_projector(
    pool: db.Pool, dsn: str
) -> None:
    app, a, b = await _lost_first_row(pool, dsn)
    await pool.execute("DELETE FROM outbox.event_journal WHERE campaign_id = $1 AND seq = 1", a)
    counts = await Worker(app, pool).run_once()
    assert (counts.applied, counts.failed, counts.dead) == (2, 0, 1)
    row = await pool.fetchrow(
        "SELECT seq, status, attempt_count, last_error FROM outbox.projection_apply_outbox "
        "WHERE campaign_id = $1 ORDER BY seq LIMIT 1",
        a,
    )
    assert row is not None
    assert (row["seq"], row["status"], row["attempt_count"]) == (2, "dead", 1)  # corruption
    assert row["last_error"] == (
        f"{CheckpointGap.__name__}: projector 'totals' is at seq 0 of campaign '{a}' "
        "and cannot apply seq 2: the journal lacks seq 1"
    )
    assert await totals(pool) == Counter({b: 10})


@pytest.mark.parametrize("batch", [False, True], ids=["per_event", "batch"])
@pytest.mark.parametrize(
    ("poison_seq", "applied_now"), [(10, 99), (4, 93)], ids=["last_of_campaign", "mid_campaign"]
)
async def test_one_failing_event_in_100_records_one_attempt_and_the_rest_apply_in_order(
    pool: db.Pool, dsn: str, batch: bool, poison_seq: int, applied_now: int
) -> None:
    await pool.execute(
        "CREATE TABLE applied (id bigserial PRIMARY KEY, campaign_id text, seq bigint)"
    )
    settings = Settings(dsn=dsn, batch_size=100)
    app = Outbox(settings)

    async def record(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
        if any(e.payload["poison"] for e in events):
            raise PermanentError("poison")
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) SELECT * FROM unnest($1::text[], $2::bigint[])",
            [e.campaign_id for e in events],
            [e.seq for e in events],
        )

    if batch:
        app.projector("recorder", events=["e"], batch=True)(record)
    else:

        @app.projector("recorder", events=["e"])
        async def recorder(tx: db.Connection, event: StoredEvent) -> None:
            await record(tx, [event])

    # 10 campaigns x 10 events (in one bucket: one batch), one poison in the fourth: 99 good
    # events. As its last event, all 99 apply; at seq 4, its seqs 5..10 wait for `recorder`
    # behind it (ordering): 93 apply now. `recorder` is held on that campaign (S24): its later
    # rows go, what it owes is its hold and its checkpoint (the journal has the events).
    names = campaigns_in_one_bucket(10, "c")
    for c in range(10):
        events = [Event("e", {"poison": c == 3 and s == poison_seq}) for s in range(1, 11)]
        await append(pool, names[c], events, settings=settings)
    counts = await Worker(app, pool).run_once()
    assert (counts.claimed, counts.applied, counts.dead) == (100, applied_now, 1)
    assert counts.held == 10 - poison_seq
    left = await pool.fetch(
        "SELECT campaign_id, seq, status, attempt_count FROM outbox.projection_apply_outbox "
        "ORDER BY campaign_id, seq"
    )
    assert [(r["campaign_id"], r["seq"], r["status"], r["attempt_count"]) for r in left] == [
        (names[3], poison_seq, "dead", 1)
    ]
    hold = await pool.fetchrow("SELECT projector, seq, status FROM outbox.projection_holds")
    assert hold is not None
    assert tuple(hold) == ("recorder", poison_seq, "dead")
    rows = await pool.fetch("SELECT campaign_id, seq FROM applied ORDER BY id")
    applied = [(r["campaign_id"], r["seq"]) for r in rows]
    assert len(applied) == len(set(applied)) == applied_now
    for c in range(10):  # per campaign, in seq order
        seqs = [s for cid, s in applied if cid == names[c]]
        assert seqs == sorted(seqs)
        assert seqs == (list(range(1, poison_seq)) if c == 3 else list(range(1, 11)))


async def test_a_batch_that_applies_is_five_round_trips_without_a_savepoint(
    pool: db.Pool, dsn: str
) -> None:
    """BEGIN, the claim, the projector, the settle, COMMIT: the claim's load and the head lock
    of a campaign the batch empties travel inside the claim's and the settle's calls."""
    await pool.execute(TOTALS)
    # A poll interval longer than the test: the paused projectors read at the first batch are
    # not read again at the second (a slow server, Citus, took longer than the default).
    settings = Settings(dsn=dsn, batch_size=100, poll_interval=60)
    app = batch_app(settings, ordered=True, idempotent=False)
    own = await open_pool(settings, max_size=1)  # the worker's one connection, logged
    try:
        sent: list[str] = []
        async with own.acquire() as conn:
            conn.add_query_logger(lambda record: sent.append(record.query.split()[0].strip(";")))
        worker = Worker(app, own)
        await appended(pool, settings, campaigns=3, per=5, one_bucket=True)
        await worker.run_once()  # the driver prepares the statements (and looks types up)
        await pool.execute("TRUNCATE totals")
        expected = await appended(pool, settings, campaigns=3, per=5, one_bucket=True)
        sent.clear()
        counts = await worker.run_once()
    finally:
        await own.close()
    assert counts.applied == 15
    assert await totals(pool) == expected
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns") == 0
    # The projector's own two statements between the claim and the settle. Before the batch,
    # outside it, the worker's read of which buckets are due: nothing told it (no NOTIFY
    # here), and it reads them at most once per poll interval while work keeps coming.
    assert sent == ["SELECT", "BEGIN", "SELECT", "INSERT", "INSERT", "SELECT", "COMMIT"], sent


async def test_a_statement_projector_pipelines_and_isolates_a_failing_event(
    pool: db.Pool, dsn: str
) -> None:
    """`app.statement`: one statement per event, sent together; a statement that fails is
    isolated by halving the batch, so only its event records an attempt (S6)."""
    await pool.execute(
        "CREATE TABLE sums (campaign_id text PRIMARY KEY, n bigint NOT NULL CHECK (n < 1000))"
    )
    settings = Settings(dsn=dsn, batch_size=100)
    app = Outbox(settings)

    @app.statement(
        "sums",
        events=["add"],
        sql="INSERT INTO sums VALUES ($1, $2) "
        "ON CONFLICT (campaign_id) DO UPDATE SET n = sums.n + excluded.n",
    )
    def sums(event: StoredEvent) -> tuple[str, int] | None:
        return None if event.payload["n"] == 0 else (event.campaign_id, event.payload["n"])

    expected: Counter[str] = Counter()
    names = campaigns_in_one_bucket(10, "c")  # one batch claims them all
    for c in range(10):
        values = [0 if s == 2 else (5000 if (c, s) == (4, 7) else c + s) for s in range(1, 11)]
        await append(pool, names[c], [Event("add", {"n": v}) for v in values], settings=settings)
        # The fifth stops at its failing seq 7 (ordering): 1..6 apply, 7 fails, 8..10 wait for
        # `sums` in its hold (its only projector: their rows go, S24).
        expected[names[c]] = sum(values[:6] if c == 4 else values)
    counts = await Worker(app, pool).run_once()
    assert (counts.claimed, counts.applied, counts.failed, counts.held) == (100, 96, 1, 3)
    rows = await pool.fetch("SELECT campaign_id, n FROM sums")
    assert Counter({r["campaign_id"]: r["n"] for r in rows}) == expected
    left = await pool.fetch(
        "SELECT seq, status, attempt_count FROM outbox.projection_apply_outbox ORDER BY seq"
    )
    assert [(r["seq"], r["status"], r["attempt_count"]) for r in left] == [(7, "failed", 1)]
