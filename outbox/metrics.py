"""Prometheus metrics of a worker process (DESIGN section 10), on their own registry.

The service counts what its batches did and what its shadow passes saw, marks the LISTEN
connection, and refreshes the queue gauges from the database now and then. `serve()` exposes
them over HTTP on `--metrics-port`. Nothing here touches the queue's correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from outbox import db
from outbox.maintenance import Q, queue_counts

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["DEDUP_CLAIMS", "REFRESH_INTERVAL", "Metrics"]

REFRESH_INTERVAL = 15.0

# The consumer dedup guard runs in the application's own processes: its counter lives on the
# default registry (which an application already exposes), and every worker registry serves it.
DEDUP_CLAIMS = Counter(
    "outbox_dedup_claims",
    "Consumer dedup claims, by scope and outcome (claimed, duplicate).",
    ["scope", "outcome"],
    registry=REGISTRY,
)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        r.register(DEDUP_CLAIMS)
        self.batches = Counter("outbox_batches", "Batches run by this process.", registry=r)
        self.events = Counter(
            "outbox_events", "Work rows handled, by outcome.", ["outcome"], registry=r
        )
        self.batch_size = Histogram(
            "outbox_batch_size",
            "Rows claimed per batch.",
            buckets=(0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 10_000),
            registry=r,
        )
        self.leases = Counter(
            "outbox_leases", "Rows leased to non-transactional projectors (S13).", registry=r
        )
        self.lease_reclaims = Counter(
            "outbox_lease_reclaims",
            "Leased rows taken back after their lease expired (each counts an attempt).",
            registry=r,
        )
        self.lease_fenced = Counter(
            "outbox_lease_fenced",
            "Leases this process lost before ending them: its completion changed nothing.",
            registry=r,
        )
        self.listener_connected = Gauge(
            "outbox_listener_connected", "1 while the LISTEN connection is up.", registry=r
        )
        self.queue_rows = Gauge("outbox_queue_rows", "Work rows by status.", ["status"], registry=r)
        self.oldest_age = Gauge(
            "outbox_oldest_claimable_age_seconds",
            "Age of the oldest pending or failed row (from enqueued_at).",
            registry=r,
        )
        self.blocked = Gauge(
            "outbox_blocked_campaigns", "Campaigns whose head row is failed or dead.", registry=r
        )
        self.shadow_max_lag = Gauge(
            "outbox_shadow_max_lag_seconds",
            "Longest enqueue-to-first-sighting lag a shadow worker saw.",
            registry=r,
        )

    def record_batch(self, counts: Any) -> None:
        """Count one batch (a worker.BatchCounts)."""
        self.batches.inc()
        self.batch_size.observe(counts.claimed)
        for outcome in ("applied", "skipped", "failed", "dead", "observed"):
            value = getattr(counts, outcome)
            if value:
                self.events.labels(outcome).inc(value)
        for counter, value in (
            (self.leases, counts.leased),
            (self.lease_reclaims, counts.reclaimed),
            (self.lease_fenced, counts.fenced),
        ):
            if value:
                counter.inc(value)

    async def refresh(self, executor: Executor, *, park: bool) -> None:
        """Queue gauges from the database (the report's own queries)."""
        async with db.acquire(executor) as conn:
            counts = await queue_counts(conn)
            oldest = await conn.fetchrow(Q.oldest_claimable, None, park)
            blocked = await conn.fetchrow(Q.blocked_campaigns, None, park, 1)
            shadow = await conn.fetchrow(Q.shadow_observations, None)
        for status, n in counts.items():
            self.queue_rows.labels(status).set(n)
        self.oldest_age.set(oldest["age_seconds"] if oldest else 0)
        self.blocked.set(blocked["total"] if blocked else 0)
        lag = shadow["max_lag_seconds"] if shadow else None
        self.shadow_max_lag.set(lag or 0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:  # noqa: S104 - scraped from outside
        """Expose /metrics; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        bound: int = server.server_port
        return bound
