"""The outbox on a three-node Citus cluster: every worker statement one task, a projection
table co-located by bucket, a kill soak with the generator's oracle, and a worker node stopped
mid-drain.

The router guard sets `citus.multi_task_query_log_level = error` on the database: from then
on Citus refuses, with an error, any statement that needs more than one task. The claim, the
settle, the leases, the ring's reads and the retries run under it, those inside the PL/pgSQL
functions included (an EXPLAIN of a function call would not show them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest
from harness import Fleet, scaled
from test_faults import _soak

from helpers import Clock, queue_count, run_cli
from outbox import Event, Settings, append, db
from outbox.buckets import bucket_of
from outbox.buckets.distribution import PLAN
from outbox.errors import TransientBatchError
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.testing.localcitus import CitusCluster
from outbox.worker.batch import Worker

# A projection table placed as docs/scaling.md says: a bucket column, distributed by it and
# co-located with the journal, so a batch's projector writes stay on the batch's shard.
TALLIES = """
CREATE TABLE tallies (
    bucket      integer NOT NULL,
    campaign_id text    NOT NULL,
    events      bigint  NOT NULL,
    PRIMARY KEY (bucket, campaign_id)
);
SELECT create_distributed_table('tallies', 'bucket', colocate_with => 'outbox.event_journal');
"""

ADD = """
INSERT INTO tallies (bucket, campaign_id, events) VALUES (outbox.outbox_bucket($1), $1, 1)
ON CONFLICT (bucket, campaign_id) DO UPDATE SET events = tallies.events + 1
"""


def tally_app(settings: Settings, *, flaky: set[tuple[str, int]]) -> Outbox:
    """An additive projector on the co-located table; `flaky` events fail their first time."""
    app = Outbox(settings)

    @app.projector("tallies", events=["step"])
    async def tallies(tx: db.Connection, event: StoredEvent) -> None:
        key = (event.campaign_id, event.seq)
        if key in flaky:
            flaky.discard(key)
            raise RuntimeError(f"first attempt of {key} fails")
        await tx.execute(ADD, event.campaign_id)

    return app


async def tallies_by_campaign(pool: db.Pool, campaigns: list[str], count: int) -> Counter[str]:
    """Per campaign, read in its own bucket (one shard each)."""
    found: Counter[str] = Counter()
    for campaign in campaigns:
        n = await pool.fetchval(
            "SELECT events FROM tallies WHERE bucket = $1 AND campaign_id = $2",
            bucket_of(campaign, count),
            campaign,
        )
        found[campaign] = n or 0
    return found


async def test_worker_statements_are_one_router_task_each(dsn: str, pool: db.Pool) -> None:
    await pool.execute(TALLIES)
    name = urlsplit(dsn).path.lstrip("/")
    await pool.execute(f'ALTER DATABASE "{name}" SET citus.multi_task_query_log_level = error')
    settings = Settings(dsn=dsn, backoff_base=0.01, backoff_cap=0.02)
    campaigns = [f"guard-{i}" for i in range(40)]
    expected = Counter({c: 3 for c in campaigns})
    flaky = {(c, 2) for c in campaigns[::4]}
    guarded = await db.create_pool(dsn, min_size=1, max_size=4)
    try:
        with pytest.raises(Exception, match="multi-task"):
            await guarded.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox")
        for campaign in campaigns:
            await append(guarded, campaign, [Event("step", {})] * 3, settings=settings)
        clock = Clock()
        worker = Worker(tally_app(settings, flaky=flaky), guarded, now=clock)
        applied = 0
        for _ in range(200):
            counts = await worker.run_once()
            applied += counts.applied
            clock.advance(1)
            if applied == sum(expected.values()):
                break
        assert not flaky  # every flaky event failed once and was retried
        count = await guarded.fetchval("SELECT outbox.outbox_bucket_count()")
        assert await tallies_by_campaign(guarded, campaigns, count) == expected
    finally:
        await guarded.close()
    assert await queue_count(pool) == 0


@asynccontextmanager
async def remote_commands(dsn: str) -> AsyncIterator[tuple[db.Pool, list[str]]]:
    """A one-connection pool on the coordinator and the list it fills with every command the
    coordinator sends to the worker nodes for it (`citus.log_remote_commands`; the listener
    goes on at each acquire: a release clears it)."""
    sent: list[str] = []

    async def listen(conn: db.Connection) -> None:
        conn.add_log_listener(lambda _conn, message: sent.append(message.message))

    pool: db.Pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=1,
        init=db.init_connection,
        setup=listen,
        server_settings={"citus.log_remote_commands": "on", "client_min_messages": "log"},
    )
    try:
        yield pool, sent
    finally:
        await pool.close()


# The release that clears the listener warns about it; the next acquire puts it back.
LISTENER_RELEASED = "ignore:.*active log listener:asyncpg.InterfaceWarning"


def two_phase(sent: list[str]) -> list[str]:
    return [m for m in sent if "PREPARE TRANSACTION" in m]


@pytest.mark.filterwarnings(LISTENER_RELEASED)
async def test_a_batch_whose_writes_stay_on_its_shard_commits_without_2pc(
    dsn: str, pool: db.Pool
) -> None:
    """Claim, co-located projector writes, failures, first and later checkpoint moves, the
    campaign rows and the settle: every batch's transaction ends with one plain COMMIT on the
    worker node, never PREPARE TRANSACTION (Citus's two-phase commit)."""
    await pool.execute(TALLIES)
    settings = Settings(dsn=dsn, batch_size=4, backoff_base=0.01, backoff_cap=0.02)
    campaigns = [f"plain-{i}" for i in range(6)]
    for campaign in campaigns:
        await append(pool, campaign, [Event("step", {})] * 5, settings=settings)
    flaky = {(c, 3) for c in campaigns[::2]}
    batches = commits = 0
    async with remote_commands(dsn) as (logged, sent):
        clock = Clock()
        worker = Worker(tally_app(settings, flaky=flaky), logged, now=clock)
        for _ in range(200):
            sent.clear()
            counts = await worker.run_once()
            clock.advance(1)
            if counts.claimed:
                batches += 1
                assert not two_phase(sent), sent
                commits += sent.count("issuing COMMIT")
            if not await queue_count(pool):
                break
    assert not flaky  # the failure path ran: every flaky event failed once, then applied
    assert batches > len(campaigns)  # batches of 4 over 5 events each: first and later ones
    assert commits >= batches  # the listener saw each batch's commit go out
    count = await pool.fetchval("SELECT outbox.outbox_bucket_count()")
    assert await tallies_by_campaign(pool, campaigns, count) == Counter({c: 5 for c in campaigns})


@pytest.mark.filterwarnings(LISTENER_RELEASED)
@pytest.mark.parametrize("events", [1, 2, 4])
async def test_an_append_of_up_to_4_events_commits_without_2pc(
    dsn: str, pool: db.Pool, events: int
) -> None:
    """New campaign, existing one, with an append key (and its retry), with an expected seq:
    the rows go by INSERT ... VALUES, routed to the campaign's shard, and the transaction ends
    plainly."""
    settings = Settings(dsn=dsn)
    batch = [Event("step", {"i": i}) for i in range(events)]
    async with remote_commands(dsn) as (logged, sent):
        first = await append(logged, "two-phase", batch, settings=settings)
        again = await append(logged, "two-phase", batch, settings=settings, idempotency_key="k")
        retried = await append(logged, "two-phase", batch, settings=settings, idempotency_key="k")
        await append(logged, "two-phase", batch, settings=settings, expected_seq=again.last_seq)
        assert not two_phase(sent), sent
        assert sent.count("issuing COMMIT") == 4
    assert (first.first_seq, again.last_seq) == (1, 2 * events)
    assert retried.duplicate
    assert retried.last_seq == again.last_seq
    assert await queue_count(pool) == 3 * events
    bucket = bucket_of("two-phase", await pool.fetchval("SELECT outbox.outbox_bucket_count()"))
    assert (
        await pool.fetchval(
            "SELECT max(seq) FROM outbox.event_journal WHERE bucket = $1 AND campaign_id = "
            "'two-phase'",
            bucket,
        )
        == 3 * events
    )


async def test_a_kill_soak_on_the_cluster(
    pool: db.Pool, dsn: str, fleet: Fleet, witness_table: None
) -> None:
    """SIGKILLed worker processes against the coordinator: lost 0, applied twice 0, order
    violations 0, counted against the generator's own record (the fault tier's harness)."""
    await _soak("citus_sigkill_soak", pool, dsn, fleet, kills=scaled(20))


async def test_a_worker_node_stopped_mid_drain(
    pool: db.Pool, dsn: str, citus: CitusCluster
) -> None:
    """Buckets whose shards are on the other node keep draining while one node is down;
    once it is back, the rest drains, and every campaign's tally equals what was appended."""
    await pool.execute(TALLIES)
    settings = Settings(dsn=dsn, batch_size=10, backoff_base=0.01, backoff_cap=0.02)
    count = await pool.fetchval("SELECT outbox.outbox_bucket_count()")
    rows = await pool.fetch(
        "SELECT b, p.nodeport FROM generate_series(0, $1 - 1) AS b, "
        "LATERAL get_shard_id_for_distribution_column('outbox.event_journal', b) AS s, "
        "pg_dist_shard_placement p WHERE p.shardid = s",
        count,
    )
    placement: dict[int, int] = {r["b"]: r["nodeport"] for r in rows}
    campaigns = [f"node-{i}" for i in range(60)]
    for campaign in campaigns:
        await append(pool, campaign, [Event("step", {})] * 2, settings=settings)
    stopped = citus.workers[1]
    on_stopped = {c for c in campaigns if placement[bucket_of(c, count)] == stopped.port}
    alive = [c for c in campaigns if c not in on_stopped]
    assert on_stopped
    assert alive
    worker = Worker(tally_app(settings, flaky=set()), pool)
    for _ in range(2):  # mid-drain: the ring knows buckets on both nodes to be due
        assert (await worker.run_once()).claimed
    stopped.stop()
    try:
        with pytest.raises(asyncpg.ConnectionFailureError):  # the node is down: its buckets
            await tallies_by_campaign(pool, sorted(on_stopped)[:1], count)
        for command in ("outbox-report", "health"):  # they read every bucket: one-line errors
            result = run_cli("maintenance", command, "--json", dsn=dsn)
            assert result.returncode == 1
            assert result.stderr.count("\n") == 1
            assert f"remote node postgres@127.0.0.1:{stopped.port}" in result.stderr
        failed = []
        for _ in range(400):
            try:
                await worker.run_once()
            except Exception as exc:  # a batch in a down bucket: the worker backs off, goes on
                failed.append(exc)
            found = await tallies_by_campaign(pool, alive, count)
            if all(found[c] == 2 for c in alive):
                break
        # A batch that met the down node failed whole (no attempt consumed) and its bucket left
        # the ring; the ring's reads leave that node's buckets out until it is back.
        assert all(isinstance(exc, TransientBatchError) for exc in failed)
        assert len(failed) <= len({bucket_of(c, count) for c in on_stopped})
        assert await tallies_by_campaign(pool, alive, count) == Counter({c: 2 for c in alive})
    finally:
        stopped.start()
    await worker.drain()
    assert await tallies_by_campaign(pool, campaigns, count) == Counter({c: 2 for c in campaigns})
    assert await queue_count(pool) == 0


def test_distribute_again_leaves_every_table_as_it_is(dsn: str) -> None:
    """The template was distributed by `distribute()`; the command finds every table placed."""
    result = run_cli("maintenance", "distribute", "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    body = orjson.loads(result.stdout)
    assert body["nodes"] == 2
    assert body["shard_count"] == body["buckets"]
    assert {t["table"]: (t["column"], t["state"]) for t in body["tables"]} == {
        p.table: (p.column, "already") for p in PLAN
    }
