"""Lease mode (S13) in process: leases, heartbeats, fencing, reclaim, order, report, metrics.

The non-transactional projector writes each delivery on its own connection (as an external
system would record calls), so the tests count deliveries independently of the queue.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from factories import make_leased

from helpers import queue_count, run_cli, wait_for
from outbox import ConfigError, Event, Settings, db
from outbox.errors import PermanentError
from outbox.model import BatchCounts, StoredEvent
from outbox.obs.metrics import Metrics
from outbox.ops.report import outbox_report
from outbox.ops.requeue import requeue_one
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker

SCHEMA = """
CREATE TABLE deliveries (id bigserial, campaign_id text, seq bigint, worker text);
CREATE TABLE ledger (id bigserial, campaign_id text, seq bigint);
"""


@dataclass
class Gate:
    """Holds the external projector until the test opens it."""

    opened: anyio.Event = field(default_factory=anyio.Event)
    entered: int = 0


def lease_app(dsn: str, gate: Gate | None = None, *, lease_seconds: float = 60) -> Outbox:
    app = Outbox(Settings(dsn=dsn, lease_seconds=lease_seconds, backoff_base=0.01))

    @app.projector("search_index", events=["order.placed"], transactional=False)
    async def search_index(pool: db.Pool, event: StoredEvent) -> None:
        if gate is not None:
            gate.entered += 1
            await gate.opened.wait()
        await pool.execute(
            "INSERT INTO deliveries (campaign_id, seq, worker) VALUES ($1, $2, $3)",
            event.campaign_id,
            event.seq,
            event.metadata.get("w", ""),
        )

    @app.projector("ledger", events=["order.placed", "order.noted"])
    async def ledger(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO ledger (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
        )

    return app


@pytest.fixture
async def schema(pool: db.Pool) -> None:
    await pool.execute(SCHEMA)


async def row(pool: db.Pool, campaign_id: str, seq: int) -> dict[str, Any] | None:
    r = await pool.fetchrow(
        "SELECT status, lease_owner, claim_epoch, attempt_count, last_error, "
        "extract(epoch FROM lease_expires_at - leased_at) AS lease, "
        "lease_expires_at > clock_timestamp() AS live, "
        "next_attempt_at = lease_expires_at AS due_at_expiry "
        "FROM outbox.projection_apply_outbox WHERE campaign_id = $1 AND seq = $2",
        campaign_id,
        seq,
    )
    return dict(r) if r else None


async def expired_lease(pool: db.Pool, campaign_id: str, *, epoch: int, attempts: int) -> None:
    """The campaign's queued row, leased by a worker that died (`gone:1`) a minute past its
    expiry."""
    await make_leased(
        pool, campaign_id, owner="gone:1", epoch=epoch, attempts=attempts, expires_in=-60
    )


async def deliveries(pool: db.Pool) -> list[tuple[str, int]]:
    rows = await pool.fetch("SELECT campaign_id, seq FROM deliveries ORDER BY id")
    return [(r["campaign_id"], r["seq"]) for r in rows]


async def ledger(pool: db.Pool) -> list[tuple[str, int]]:
    rows = await pool.fetch("SELECT campaign_id, seq FROM ledger ORDER BY campaign_id, seq")
    return [(r["campaign_id"], r["seq"]) for r in rows]


def test_a_non_transactional_projector_takes_no_guard_and_needs_campaign_ordering() -> None:
    app = Outbox(Settings())
    with pytest.raises(ConfigError, match="transactional=False"):
        app.projector("x", events=["t"], transactional=False, ordered=True)(_noop)
    with pytest.raises(ConfigError, match="transactional=False"):
        app.projector("y", events=["t"], transactional=False, batch=True)(_noop)
    app.projector("z", events=["t"], transactional=False)(_noop)
    with pytest.raises(ConfigError, match="OUTBOX_ORDERING=none cannot serve non-transactional"):
        app.registry.validate(Settings(ordering="none"))


async def _noop(tx: db.Connection, event: StoredEvent) -> None:
    return None


async def test_a_lease_commits_processing_then_completes_outside_the_batch(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    gate = Gate()
    app = lease_app(dsn, gate, lease_seconds=90)
    await app.append(pool, "o-1", [Event("order.noted", {}), Event("order.placed", {})])
    worker = Worker(app, pool)
    async with batch_held_at(gate, worker) as counts:
        # The batch committed: seq 1 applied, seq 2 leased with the database's clock.
        leased = await row(pool, "o-1", 2)
        assert leased is not None
        assert (leased["status"], leased["lease_owner"], leased["claim_epoch"]) == (
            "processing",
            worker.worker_id,
            1,
        )
        assert float(leased["lease"]) == pytest.approx(90, abs=5)  # a beat may have run
        assert leased["live"]
        assert leased["due_at_expiry"]
        assert await ledger(pool) == [("o-1", 1)]
        # Another worker's claim finds nothing: the campaign waits behind its leased head.
        assert (await Worker(app, pool).run_once()).claimed == 0
        # The report shows the lease with its owner and age.
        report = await outbox_report(pool)
        (lease,) = report.summary.leases
        assert (lease.campaign_id, lease.seq, lease.lease_owner) == ("o-1", 2, worker.worker_id)
        # Both read one clock: the age so far and the time left add up to the 90 s lease, and
        # to more by as much as a heartbeat came after the lease was taken (never more than
        # the age: a beat extends to its own instant plus 90 s).
        assert lease.lease_age_seconds is not None
        assert lease.expires_in_seconds is not None
        assert 0 < lease.expires_in_seconds <= 90
        total = lease.lease_age_seconds + lease.expires_in_seconds
        assert 90 - 1e-3 <= total <= 90 + lease.lease_age_seconds + 1e-3
        assert report.summary.counts.processing == 1
        gate.opened.set()
    assert (counts.applied, counts.leased, counts.reclaimed, counts.fenced) == (2, 1, 0, 0)
    assert await row(pool, "o-1", 2) is None
    assert await deliveries(pool) == [("o-1", 2)]
    assert await ledger(pool) == [("o-1", 1), ("o-1", 2)]
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns") == 0


async def _entered(gate: Gate) -> bool:
    return gate.entered > 0


@asynccontextmanager
async def batch_held_at(gate: Gate, worker: Worker) -> AsyncIterator[BatchCounts]:
    """Run one batch in the background and enter the block once its external projector waits
    at `gate` (the block opens it); the counts are complete when the block has ended."""
    counts = BatchCounts()

    async def run() -> None:
        counts.add(await worker.run_once())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await wait_for(lambda: _entered(gate))
        yield counts


async def test_fencing_a_slow_worker_changes_nothing_after_a_reclaim(
    pool: db.Pool, dsn: str, schema: None, caplog: pytest.LogCaptureFixture
) -> None:
    slow_gate = Gate()
    slow = Worker(lease_app(dsn, slow_gate, lease_seconds=60), pool)
    await slow.app.append(pool, "o-2", [Event("order.placed", {})])
    async with batch_held_at(slow_gate, slow) as slow_counts:
        # Another worker, its clock past the slow one's lease, reclaims and completes the row.
        later = datetime.now(UTC) + timedelta(minutes=10)
        fast = Worker(lease_app(dsn, lease_seconds=60), pool, now=lambda: later)
        fast_counts = await fast.run_once()
        assert (fast_counts.reclaimed, fast_counts.applied, fast_counts.fenced) == (1, 1, 0)
        assert await row(pool, "o-2", 1) is None
        assert await ledger(pool) == [("o-2", 1)]
        # Now the slow worker finishes: its completion is fenced and changes nothing.
        before = await pool.fetchval("SELECT count(*) FROM outbox.projection_checkpoints")
        slow_gate.opened.set()
    assert (slow_counts.applied, slow_counts.fenced) == (0, 1)
    assert await ledger(pool) == [("o-2", 1)]  # the transactional projector: once
    assert await deliveries(pool) == [("o-2", 1), ("o-2", 1)]  # at-least-once, both ran
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_checkpoints") == before
    fenced = [r for r in caplog.records if r.getMessage() == "lease.fenced"]
    assert len(fenced) == 1
    assert fenced[0].__dict__["stage"] == "completion"
    # Both outcomes reach the metrics.
    metrics = Metrics()
    metrics.record_batch(slow_counts)
    metrics.record_batch(fast_counts)
    assert metrics.registry.get_sample_value("outbox_lease_fenced_total") == 1
    assert metrics.registry.get_sample_value("outbox_lease_reclaims_total") == 1
    assert metrics.registry.get_sample_value("outbox_leases_total") == 2


async def test_an_expired_lease_counts_an_attempt_and_dies_on_the_last(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    app = lease_app(dsn, lease_seconds=60)
    app.settings = app.settings.replace(max_attempts=2)
    await app.append(pool, "o-3", [Event("order.placed", {})])
    await expired_lease(pool, "o-3", epoch=4, attempts=1)
    counts = await Worker(app, pool).run_once()
    assert (counts.reclaimed, counts.dead, counts.leased) == (1, 1, 0)
    dead = await row(pool, "o-3", 1)
    assert dead is not None
    assert (dead["status"], dead["attempt_count"]) == ("dead", 2)
    assert "lease expired (owner gone:1, epoch 4)" in str(dead["last_error"])
    assert await deliveries(pool) == []


async def test_a_reclaim_below_the_limit_runs_again_with_the_attempt_counted(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    gate = Gate()
    app = lease_app(dsn, gate, lease_seconds=60)
    await app.append(pool, "o-4", [Event("order.placed", {})])
    await expired_lease(pool, "o-4", epoch=1, attempts=0)
    worker = Worker(app, pool)
    async with batch_held_at(gate, worker):
        again = await row(pool, "o-4", 1)
        assert again is not None
        assert (again["status"], again["claim_epoch"], again["attempt_count"]) == (
            "processing",
            2,
            1,
        )
        assert "lease expired: owner gone:1, epoch 1" in str(again["last_error"])
        # The report shows the reclaimed lease: its new owner and epoch, the counted attempt.
        (lease,) = (await outbox_report(pool)).summary.leases
        assert (lease.lease_owner, lease.claim_epoch, lease.attempt_count) == (
            worker.worker_id,
            2,
            1,
        )
        assert (lease.last_error or "").startswith("lease expired: owner gone:1")
        table = run_cli("maintenance", "outbox-report", dsn=dsn)
        assert table.returncode == 0, table.stderr
        assert "leases (processing rows)" in table.stdout
        gate.opened.set()
    assert await deliveries(pool) == [("o-4", 1)]


async def test_a_failing_projector_records_an_attempt_fenced_by_its_lease(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    app = Outbox(Settings(dsn=dsn, backoff_base=0.01, backoff_cap=0.01))

    @app.projector("webhook", events=["order.placed"], transactional=False)
    async def webhook(pool_: db.Pool, event: StoredEvent) -> None:
        raise RuntimeError("503 from the webhook")

    await app.append(pool, "o-5", [Event("order.placed", {})])
    counts = await Worker(app, pool).run_once()
    assert (counts.leased, counts.failed) == (1, 1)
    failed = await row(pool, "o-5", 1)
    assert failed is not None
    assert (failed["status"], failed["attempt_count"]) == ("failed", 1)
    assert "503 from the webhook" in str(failed["last_error"])
    # The campaign is queued again for the retry.
    assert await pool.fetchval("SELECT head_seq FROM outbox.projection_apply_campaigns") == 1


async def test_a_failing_lease_projector_holds_only_that_event(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    app = lease_app(dsn)
    broken = {("o-7", 1)}
    app.registry.projectors.pop("search_index")

    @app.projector("search_index", events=["order.placed"], transactional=False)
    async def search_index(pool_: db.Pool, event: StoredEvent) -> None:
        if (event.campaign_id, event.seq) in broken:
            raise PermanentError("410 from the index")
        await pool_.execute(
            "INSERT INTO deliveries (campaign_id, seq) VALUES ($1, $2)",
            event.campaign_id,
            event.seq,
        )

    kinds = ["order.placed", "order.noted", "order.placed", "order.placed"]
    await app.append(pool, "o-7", [Event(k, {}) for k in kinds])
    worker = Worker(app, pool)
    await worker.drain()
    # The index is dead on seq 1 and holds it alone: the ledger took every event, the index the
    # later ones, in order; the row stays, dead, for an operator.
    assert await ledger(pool) == [("o-7", s) for s in range(1, 5)]
    assert await deliveries(pool) == [("o-7", 3), ("o-7", 4)]
    held = await pool.fetch(
        "SELECT projector, seq, status, attempt_count FROM outbox.projection_holds"
    )
    assert [tuple(h) for h in held] == [("search_index", 1, "dead", 1)]
    dead = await row(pool, "o-7", 1)
    assert dead is not None
    assert (dead["status"], dead["attempt_count"]) == ("dead", 1)
    assert "search_index" in str(dead["last_error"])
    assert await queue_count(pool) == 1
    broken.clear()  # the index is back: a requeue retries it alone, the ledger not again
    await requeue_one(pool, "o-7", 1, projector="search_index")
    await worker.drain()
    assert await deliveries(pool) == [("o-7", 3), ("o-7", 4), ("o-7", 1)]
    assert await ledger(pool) == [("o-7", s) for s in range(1, 5)]
    assert await queue_count(pool) == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0


async def test_the_heartbeat_keeps_a_long_projector_alive(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    gate = Gate()
    app = lease_app(dsn, gate, lease_seconds=1.5)
    await app.append(pool, "o-6", [Event("order.placed", {})])
    worker = Worker(app, pool)
    async with batch_held_at(gate, worker) as counts:
        first = await pool.fetchval("SELECT lease_expires_at FROM outbox.projection_apply_outbox")

        async def held_past_its_first_expiry() -> bool:
            held: bool = await pool.fetchval(
                "SELECT clock_timestamp() > $1 AND lease_expires_at > clock_timestamp() "
                "FROM outbox.projection_apply_outbox",
                first,
            )
            return held

        await wait_for(held_past_its_first_expiry)
        # Past the first lease, still held: nobody else can take it.
        assert (await Worker(app, pool).run_once()).claimed == 0
        gate.opened.set()
    assert (counts.applied, counts.fenced) == (1, 0)
    assert await deliveries(pool) == [("o-6", 1)]


async def test_the_heartbeat_survives_a_projector_that_blocks_the_event_loop(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    app = Outbox(Settings(dsn=dsn, lease_seconds=3))
    alive: list[bool] = []

    @app.projector("cpu_bound", events=["order.placed"], transactional=False)
    async def cpu_bound(pool_: db.Pool, event: StoredEvent) -> None:
        # Five seconds of work in one-second blocking slices, longer than the 3 s lease.
        for _ in range(5):
            time.sleep(1)  # noqa: ASYNC251 - the point: a projector hogging the loop
            await anyio.lowlevel.checkpoint()
            alive.append(
                await pool_.fetchval(
                    "SELECT lease_expires_at > clock_timestamp() FROM "
                    "outbox.projection_apply_outbox"
                )
            )

    await app.append(pool, "o-7", [Event("order.placed", {})])
    counts = await Worker(app, pool).run_once()
    assert alive == [True] * 5
    assert (counts.applied, counts.fenced, counts.reclaimed) == (1, 0, 0)
    assert await queue_count(pool) == 0


async def test_per_campaign_order_across_transactional_and_leased_projectors(
    pool: db.Pool, dsn: str, schema: None
) -> None:
    app = lease_app(dsn, lease_seconds=30)
    await pool.execute("CREATE TABLE trail (id bigserial, campaign_id text, seq bigint)")
    # Both projectors also write one shared trail: its ids are the order things happened in.
    await pool.execute(
        "CREATE FUNCTION trail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO trail (campaign_id, seq) VALUES (NEW.campaign_id, NEW.seq); RETURN NEW; "
        "END $$; "
        "CREATE TRIGGER d AFTER INSERT ON deliveries FOR EACH ROW EXECUTE FUNCTION trail(); "
        "CREATE TRIGGER l AFTER INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION trail();"
    )
    expected: dict[str, list[int]] = {}
    for c in range(6):
        cid = f"mix-{c}"
        types = ["order.placed" if (c + i) % 3 == 0 else "order.noted" for i in range(12)]
        for i in range(0, 12, 4):
            await app.append(pool, cid, [Event(t, {}) for t in types[i : i + 4]])
        expected[cid] = list(range(1, 13))
    worker = Worker(app, pool)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(_drain, worker)
    trail = await pool.fetch("SELECT campaign_id, seq FROM trail ORDER BY id")
    seen: dict[str, list[int]] = {}
    for r in trail:
        seen.setdefault(r["campaign_id"], []).append(r["seq"])
    for cid, seqs in seen.items():
        assert seqs == sorted(seqs), f"{cid} applied out of order: {seqs}"
    assert {cid: sorted(set(s)) for cid, s in seen.items()} == expected
    assert await ledger(pool) == sorted((cid, s) for cid, ss in expected.items() for s in ss)
    assert await queue_count(pool) == 0


async def _drain(worker: Worker) -> None:
    await worker.drain()
