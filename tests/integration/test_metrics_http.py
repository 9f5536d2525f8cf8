"""Metrics as Prometheus scrapes them: per-projector series moving during a run, 404 off
/metrics, the bind address, gauges with values (not just names), transient errors by SQLSTATE,
and the alert rules and the exposition checked by promtool when it is installed."""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import ROOT, wait_for
from outbox import Event, Settings, db
from outbox.model import StoredEvent
from outbox.obs.metrics import Metrics
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker
from outbox.worker.gauges import refresh_gauges
from outbox.worker.service import Service, ServiceConfig

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt install prometheus)"
)


def ledger_app(dsn: str) -> Outbox:
    app = Outbox(Settings(dsn=dsn, poll_interval=0.05))

    @app.projector("ledger", events=["deposited"])
    async def ledger(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("SELECT pg_sleep(0.001)")

    @app.projector("audit", events=["deposited"], ordered=False, idempotent=True)
    async def audit(tx: db.Connection, event: StoredEvent) -> None:
        return None

    return app


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a local test URL
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_scrape_during_a_run_shows_the_per_projector_series_moving(
    pool: db.Pool, dsn: str
) -> None:
    app = ledger_app(dsn)
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn, metrics_port=0))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        assert service.metrics_address is not None
        host, port = service.metrics_address
        assert host == "127.0.0.1"  # the default bind address, never every interface
        url = f"http://{host}:{port}"
        scrape: Callable[[], tuple[int, str]] = partial(get, f"{url}/metrics")

        async def applied_at_least(n: int) -> bool:
            _, text = await anyio.to_thread.run_sync(scrape)
            return value(text, "outbox_apply_total", projector="ledger", outcome="applied") >= n

        await app.append(pool, "acct-1", [Event("deposited", {})] * 3)
        await wait_for(partial(applied_at_least, 3))
        _, first = await anyio.to_thread.run_sync(scrape)
        await app.append(pool, "acct-2", [Event("deposited", {})] * 4)
        await wait_for(partial(applied_at_least, 7))
        status, second = await anyio.to_thread.run_sync(scrape)
        assert status == 200
        for name, labels in [
            ("outbox_apply_total", {"projector": "audit", "outcome": "applied"}),
            ("outbox_apply_duration_seconds_count", {"projector": "ledger"}),
            ("outbox_append_to_apply_seconds_count", {}),
        ]:
            assert value(second, name, **labels) > value(first, name, **labels) > 0, name
        assert value(second, "outbox_append_to_apply_seconds_sum") > 0
        # Nothing is labelled by campaign.
        assert "acct-1" not in second
        # Any other path is a 404.
        for path in ("/", "/metrics/", "/favicon.ico", "/metricsx"):
            code, _ = await anyio.to_thread.run_sync(get, f"{url}{path}")
            assert code == 404, path
        service.stop()
    # The service stopped its server: the port answers no more (a refused connection).
    with pytest.raises(urllib.error.URLError) as refused:
        await anyio.to_thread.run_sync(scrape)
    assert isinstance(refused.value.reason, ConnectionRefusedError)


async def test_the_gauges_carry_values(pool: db.Pool, dsn: str) -> None:
    app = ledger_app(dsn)
    await app.append(pool, "waiting", [Event("deposited", {})])
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET enqueued_at = now() - interval '90 s'"
    )
    metrics = Metrics()
    await refresh_gauges(metrics, pool, park=False)
    sample = metrics.registry.get_sample_value
    # The row waits: the oldest claimable age is its age, not the gauge's default 0.
    age = sample("outbox_oldest_claimable_age_seconds")
    assert age is not None
    assert age >= 90
    assert sample("outbox_queue_rows", {"status": "pending"}) == 1
    # The listener gauge says 1 while LISTEN is up, 0 after the service stopped.
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))

        with anyio.fail_after(30):
            await service.wait_listening()
        assert service.metrics.registry.get_sample_value("outbox_listener_connected") == 1
        service.stop()
    assert service.metrics.registry.get_sample_value("outbox_listener_connected") == 0


async def test_transient_errors_are_counted_by_sqlstate(pool: db.Pool, dsn: str) -> None:
    app = Outbox(Settings(dsn=dsn, poll_interval=0.05))

    @app.projector("slow", events=["deposited"])
    async def slow(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock(77)")

    await app.append(pool, "acct", [Event("deposited", {})])
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn))
    async with pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock(77)")
        async with anyio.create_task_group() as tg:
            await tg.start(partial(service.run, shutdown_timeout=5))

            async def waiting_backend() -> int | None:
                pid: int | None = await pool.fetchval(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                return pid

            async def backend_waits() -> bool:
                return await waiting_backend() is not None

            await wait_for(backend_waits)
            await pool.execute("SELECT pg_cancel_backend($1)", await waiting_backend())

            async def cancellation_counted() -> bool:
                return canceled(service) >= 1  # 57014: query_canceled

            await wait_for(cancellation_counted)
            await holder.execute("SELECT pg_advisory_unlock(77)")
            service.stop()
    assert canceled(service) >= 1


def canceled(service: Service) -> float:
    counted = service.metrics.registry.get_sample_value(
        "outbox_transient_errors_total", {"sqlstate": "57014"}
    )
    return counted or 0.0


@needs_promtool
def test_the_alert_rules_pass_promtool() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(ROOT / "docs" / "alerts.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
async def test_a_scrape_passes_promtool(pool: db.Pool, dsn: str) -> None:
    assert PROMTOOL is not None
    app = ledger_app(dsn)
    await app.append(pool, "a", [Event("deposited", {})])
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn, metrics_port=0))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        assert service.metrics_address is not None
        host, port = service.metrics_address
        _, text = await anyio.to_thread.run_sync(get, f"http://{host}:{port}/metrics")
        service.stop()
    done = await anyio.run_process([PROMTOOL, "check", "metrics"], input=text.encode(), check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


def test_the_alert_rules_parse_and_name_real_metrics() -> None:
    """Without promtool: the file is YAML-shaped as Prometheus wants, and every metric an
    expression names is one the worker exports."""
    text = (ROOT / "docs" / "alerts.yml").read_text()
    exported = {
        "outbox_oldest_claimable_age_seconds",
        "outbox_events_total",
        "outbox_blocked_campaigns",
        "outbox_listener_connected",
        "outbox_batches_total",
        "outbox_oldest_snapshot_seconds",
        "outbox_queue_rotations_total",
    }
    exprs = [line.split("expr:", 1)[1] for line in text.splitlines() if "expr:" in line]
    assert len(exprs) == 7
    for name in exported:
        assert any(name in e for e in exprs), name
    metrics = Metrics()
    names = {s.name for f in metrics.registry.collect() for s in f.samples} | {
        f.name for f in metrics.registry.collect()
    }
    for name in exported:
        assert name in names or name.removesuffix("_total") in names, name


def test_the_bind_address_is_honoured() -> None:
    """Bound to 127.0.0.2, the endpoint answers there and refuses 127.0.0.1 (the loopback
    network is 127.0.0.0/8 on Linux)."""
    host, port = Metrics().serve(0, "127.0.0.2")
    assert host == "127.0.0.2"
    status, _ = get(f"http://127.0.0.2:{port}/metrics")
    assert status == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
